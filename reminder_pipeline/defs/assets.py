"""The dispatcher as an asset in the catalog: each dispatch run records one materialization of it.

Declared with ``AssetSpec``: the dispatcher is an op job of four steps, and the asset is where a
run's figures land and are plotted (``relay_outbox`` records them). The design's alerts are its
checks (:mod:`.checks`); its freshness policy turns it stale when no dispatch run recorded
anything for 5 minutes (every run that reaches the relay records, even one that sent nothing).
"""

from __future__ import annotations

from datetime import timedelta

from dagster import AssetKey, AssetSpec, FreshnessPolicy

from ..domain import contract
from ..domain.model import FIGURES

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

reminder_dispatch_asset = AssetSpec(
    key=DISPATCH_ASSET_KEY,
    description=(
        "The calendar reminder dispatcher (ReminderDispatchJob): due Pending reminders moved to "
        f"Sent/Skipped, one ReminderDueEvent per Sent row published to {contract.TOPIC}. "
        "Each run of reminder_dispatch / reminder_catch_up records one materialization with its "
        "counts, backlog and lateness."
    ),
    group_name="calendar",
    kinds={"postgres", "kafka"},
    metadata={"topic": contract.TOPIC, "jobs": "reminder_dispatch, reminder_catch_up"},
    freshness_policy=FreshnessPolicy.time_window(fail_window=timedelta(minutes=5)),
)
