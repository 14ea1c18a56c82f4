"""The design's alerts as asset checks on ``calendar/reminder_dispatch``, one per :func:`health.evaluate` result.

The conditions live in :mod:`reminder_pipeline.observability.health` (the same thresholds as the
Prometheus rules); this module only turns their verdicts into ``AssetCheckResult``s with the
figures and the runbook section as metadata.

Why not results logged by the dispatch run: liveness means "a cycle succeeded in the last 5
minutes", which must turn red precisely when no dispatch run happens. So the checks are evaluated
every minute by the ``reminder_health_sensor`` (in the daemon's code server, reported as runless
check evaluations, outside the dispatch concurrency limit), and an operator can press "Execute"
on any check in the UI (``reminder_health_checks``, the checks alone). Evaluating them from a
sensor, not a scheduled run, spares a run worker (3-5 s of CPU) a minute, which started in the
same second as the dispatch run's and made an idle cycle twice as slow on two cores
(benchmarks/README.md). The checks read the database only (live tables and the metrics ledger),
so whichever process evaluates them gives the same answer.
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotation at definition time.

from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    MetadataValue,
    multi_asset_check,
)

from ..observability import health
from .assets import DISPATCH_ASSET_KEY
from .resources import PostgresResource

_MIN = 60.0

#: Check name -> (what it asserts, runbook section); names and order as health.evaluate returns them.
CHECKS: dict[str, tuple[str, str]] = {
    "dispatch_liveness": (
        (f"A dispatch cycle succeeded in the last {health.LIVENESS_SECONDS / _MIN:.0f} minutes "
         "(metrics ledger; every reminder_dispatch / reminder_catch_up run records its cycle)."),
        health.RUNBOOK_LIVENESS,
    ),
    "no_overdue_reminders": (
        f"No Pending reminder is due more than {health.OVERDUE_SECONDS / _MIN:.0f} minutes ago.",
        health.RUNBOOK_OVERDUE,
    ),
    "dispatch_errors": (
        (f"No reminder held back by repeated failures (>= {health.POISON_MIN_ATTEMPTS} attempts), "
         f"and errors (failed cycles, failing rows, refused deliveries) not going on for "
         f"{health.ERRORS_WINDOW.total_seconds() / _MIN:.0f} minutes without a "
         f"{health.ERRORS_GAP.total_seconds() / _MIN:.0f}-minute gap."),
        health.RUNBOOK_ERRORS,
    ),
    "outbox_backlog": (
        f"The oldest unpublished outbox message is at most {health.OUTBOX_LAG_SECONDS:.0f} s old.",
        health.RUNBOOK_OUTBOX,
    ),
    "lateness_slo": (
        (f"Lateness p95 (SentAt - DueAt) over {health.LATENESS_WINDOW.total_seconds() / _MIN:.0f} "
         f"minutes within the {health.LATENESS_SLO_SECONDS:.0f} s SLO (a warning, not a page)."),
        health.RUNBOOK_LATENESS,
    ),
}

_SEVERITY = {"ERROR": AssetCheckSeverity.ERROR, "WARN": AssetCheckSeverity.WARN}


def check_metadata(check: health.HealthCheck) -> dict[str, MetadataValue]:
    """The check's figures typed for the UI (numbers stay numbers, so they plot); the runbook as a path."""
    out: dict[str, MetadataValue] = {}
    for key, value in check.metadata.items():
        if key == "runbook_url":
            continue
        if value is None:
            out[key] = MetadataValue.null()
        elif isinstance(value, bool | int):
            out[key] = MetadataValue.int(int(value))
        elif isinstance(value, float):
            out[key] = MetadataValue.float(value)
        else:
            out[key] = MetadataValue.text(str(value))
    # A repository path, not a URL: a relative link in the UI would point at the webserver.
    out["runbook"] = MetadataValue.path(check.runbook_url)
    return out


def _verdict(check: health.HealthCheck) -> dict:
    """What a result and a runless evaluation of the check say, as their common arguments."""
    return {
        "asset_key": DISPATCH_ASSET_KEY,
        "check_name": check.name,
        "passed": check.passed,
        "severity": _SEVERITY.get(check.severity, AssetCheckSeverity.ERROR),
        "description": check.description,
        "metadata": check_metadata(check),
    }


def check_result(check: health.HealthCheck) -> AssetCheckResult:
    """One health verdict as the result of the check of the same name (the check job)."""
    return AssetCheckResult(**_verdict(check))


def check_evaluation(check: health.HealthCheck) -> AssetCheckEvaluation:
    """The same verdict as a runless evaluation (what the health sensor reports)."""
    return AssetCheckEvaluation(**_verdict(check))


@multi_asset_check(
    name="reminder_dispatch_health",
    specs=[
        AssetCheckSpec(name, asset=DISPATCH_ASSET_KEY, description=text,
                       metadata={"runbook": MetadataValue.path(runbook)})
        for name, (text, runbook) in CHECKS.items()
    ],
    can_subset=True,
    description="The design's alert conditions, read from the database (health.evaluate).",
)
def reminder_dispatch_health(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> Iterator[AssetCheckResult]:
    """Evaluate every condition once, report the selected checks (all of them from the schedule)."""
    selected = context.selected_asset_check_keys
    for check in health.evaluate(postgres.engine):
        if AssetCheckKey(DISPATCH_ASSET_KEY, check.name) in selected:
            yield check_result(check)
