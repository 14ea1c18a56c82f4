"""The design's alerts as asset checks on ``calendar/reminder_dispatch``, one per health condition.

The conditions are plain functions over the database (:mod:`reminder_pipeline.observability.health`,
the same thresholds as the Prometheus rules). Every dispatch run records all of them right after
its materialization (``relay_outbox``), so the UI never shows them "Not evaluated" against the
latest materialization: Dagster counts a check logged by the materializing run as targeting it
(docs/operations.md). Between runs ``reminder_health_sensor`` evaluates them every minute without
a run (liveness must turn red precisely when no dispatch run happens); *Execute* on a check in the
UI runs ``reminder_health_checks``. Each check's runbook section is a link (``runbook``): the
docs base URL (``REMINDER_DOCS_BASE_URL``) joined with the runbook's place under ``docs/``.
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotation.

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

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

from ..config import docs_base_url
from ..observability import health
from .assets import DISPATCH_ASSET_KEY
from .resources import PostgresResource

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def runbook_link(path: str, base_url: str | None = None) -> MetadataValue:
    """A runbook's repository path (``docs/runbooks/x.md#section``) as a URL under the docs base."""
    base = docs_base_url() if base_url is None else base_url
    return MetadataValue.url(base + path.removeprefix("docs/"))


def _verdict(check: health.HealthCheck) -> dict[str, Any]:
    """What a result and a runless evaluation of the check say: figures stay numbers (plotted)."""
    metadata: dict[str, Any] = {
        k: MetadataValue.null() if v is None else v
        for k, v in check.metadata.items()
        if k != "runbook_url"
    }
    # An absolute URL: a relative link in the UI would point at the webserver.
    metadata["runbook"] = runbook_link(check.runbook_url)
    return {
        "asset_key": DISPATCH_ASSET_KEY,
        "check_name": check.name,
        "passed": check.passed,
        "severity": AssetCheckSeverity.WARN
        if check.severity == "WARN"
        else AssetCheckSeverity.ERROR,
        "description": check.description,
        "metadata": metadata,
    }


def check_evaluation(check: health.HealthCheck) -> AssetCheckEvaluation:
    """A verdict as an evaluation event (what the health sensor and a dispatch run report)."""
    return AssetCheckEvaluation(**_verdict(check))


def evaluate_all(
    engine: "Engine", unpublished_of_run: int = 0, holder: Optional[str] = None
) -> list[AssetCheckEvaluation]:
    """Every check of the dispatcher, evaluated now from the database, in ``health.CHECKS`` order.

    The one list both the sensor and ``relay_outbox`` report: a check added to ``health.CHECKS``
    (and ``health.ASSERTIONS``, its spec) is recorded by both without touching them. A run that
    left ``unpublished_of_run`` of its outbox rows unpublished says so on ``outbox_backlog`` (a
    warning, :func:`health.partial_publish`).
    """
    checks = health.partial_publish(health.evaluate(engine), unpublished_of_run, holder)
    return [check_evaluation(check) for check in checks]


@multi_asset_check(
    name="reminder_dispatch_health",
    specs=[
        AssetCheckSpec(
            name,
            asset=DISPATCH_ASSET_KEY,
            description=text,
            metadata={"runbook": runbook_link(runbook)},
        )
        for name, (text, runbook) in health.ASSERTIONS.items()
    ],
    can_subset=True,
    description="The design's alert conditions, read from the database (health.evaluate).",
)
def reminder_dispatch_health(
    context: AssetCheckExecutionContext, postgres: PostgresResource
) -> Iterator[AssetCheckResult]:
    """Evaluate every condition once, report the selected checks."""
    for check in health.evaluate(postgres.engine):
        if AssetCheckKey(DISPATCH_ASSET_KEY, check.name) in context.selected_asset_check_keys:
            yield AssetCheckResult(**_verdict(check))
