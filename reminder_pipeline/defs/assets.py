"""The dispatcher as an asset in the catalog: each dispatch run records one materialization of it.

Declared with ``AssetSpec``: the dispatcher is an op job of four steps, and the asset is where a
run's figures land and are plotted (``relay_outbox`` records them). The design's alerts are its
checks (:mod:`.checks`); its freshness policy turns it stale when no dispatch run recorded
anything for 5 minutes (every run that reaches the relay records, even one that sent nothing).

Dagster lists a schedule under an asset's "Automation" only when the scheduled job materializes
the asset through its asset layer (an asset job); ours records it from an op, so the page shows
"External Asset" and "No automations found". The description and the metadata name the schedule
and the jobs instead, with links to their pages in the UI, and the runbook as a link into the
docs (``REMINDER_DOCS_BASE_URL``; docs/configuration.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from dagster import AssetKey, AssetSpec, FreshnessPolicy, MetadataValue

from ..config import dagster_ui_url, docs_base_url
from ..domain import contract
from ..domain.model import FIGURES
from ..local.dagster_processes import LOCATION_NAME

DISPATCH_ASSET_KEY = AssetKey(["calendar", "reminder_dispatch"])

#: Numeric metadata every materialization carries (0 rather than None, so the UI plots it).
NUMERIC_METADATA = (
    *FIGURES.values(),
    "duration_ms",
    "backlog_remaining",
    "oldest_due_age_seconds",
    "max_lateness_seconds",
    "outbox_unpublished",
    "unpublished_of_run",
    "batch_size",
)

#: The code location every workspace file names (workspace.yaml, docker/workspace.yaml,
#: reminder_pipeline/dagster_workspace.yaml): the UI's pages of jobs and schedules live under it.
CODE_LOCATION = LOCATION_NAME
#: The schedule that feeds the asset and the jobs whose runs record its materializations (the
#: two over ``relay_outbox``; a test holds these names to the definitions).
DISPATCH_SCHEDULE = "reminder_dispatch_schedule"
WRITING_JOBS = ("reminder_dispatch", "reminder_catch_up")
#: The runbook of the asset (relative to the docs base URL).
DISPATCH_RUNBOOK = "runbooks/reminder-dispatch.md"


def ui_page(ui_url: str, kind: str, name: str) -> str:
    """The Dagster UI's page of a job or schedule (``kind``: "jobs" or "schedules")."""
    return f"{ui_url.rstrip('/')}/locations/{CODE_LOCATION}/{kind}/{name}"


def dispatch_links(ui_url: str, docs_url: str) -> dict[str, str]:
    """The asset's links by label: the schedule, each writing job, the runbook."""
    return {
        "schedule": ui_page(ui_url, "schedules", DISPATCH_SCHEDULE),
        **{f"job {name}": ui_page(ui_url, "jobs", name) for name in WRITING_JOBS},
        "runbook": docs_url + DISPATCH_RUNBOOK,
    }


def dispatch_asset(env: Mapping[str, str] | None = None) -> AssetSpec:
    """The dispatcher's spec, its links built from the environment (the UI's port, the docs)."""
    links = dispatch_links(dagster_ui_url(env), docs_base_url(env))
    jobs = " and ".join(f"[{name}]({links[f'job {name}']})" for name in WRITING_JOBS)
    return AssetSpec(
        key=DISPATCH_ASSET_KEY,
        description=(
            "The calendar reminder dispatcher (ReminderDispatchJob): due Pending reminders moved "
            f"to Sent/Skipped, one ReminderDueEvent per Sent row published to {contract.TOPIC}.\n\n"
            f"Fed every minute by the schedule [{DISPATCH_SCHEDULE}]({links['schedule']}); each "
            f"run of {jobs} records one materialization with its counts, backlog and lateness "
            "(an op job records it, so Dagster shows the asset as external, with no "
            "Materialize button and no automation of its own). "
            f"Runbook: [{DISPATCH_RUNBOOK}]({links['runbook']})."
        ),
        group_name="calendar",
        kinds={"postgres", "kafka"},
        metadata={
            "topic": contract.TOPIC,
            "jobs": ", ".join(WRITING_JOBS),
            **{label: MetadataValue.url(url) for label, url in links.items()},
        },
        freshness_policy=FreshnessPolicy.time_window(fail_window=timedelta(minutes=5)),
    )


reminder_dispatch_asset = dispatch_asset()
