"""The dispatcher as an asset in the catalog: each dispatch run records one materialization of it.

It is declared with ``AssetSpec`` (not ``@asset``) because the dispatcher is an op job with four
steps: the asset is where the run's figures land and are plotted, not a step that computes a
value. The ``relay_outbox`` op records the materialization. The design's alerts are asset checks on
it (:mod:`reminder_pipeline.defs.checks`), and its freshness policy turns it stale in the UI when
no dispatch run has recorded anything for 5 minutes.
"""

from __future__ import annotations

from datetime import timedelta

from dagster import AssetKey, AssetSpec, FreshnessPolicy

from ..domain import contract

DISPATCH_ASSET_KEY = AssetKey(["calendar", "reminder_dispatch"])

#: No materialization for this long: the asset is stale in the UI (the design's 5-minute liveness).
FRESHNESS_FAIL_WINDOW = timedelta(minutes=5)

#: Numeric metadata every materialization carries (0 / 0.0 rather than None, so the UI plots it).
NUMERIC_METADATA = (
    "sent_count",
    "skipped_count",
    "skipped_locked_count",
    "failed_count",
    "published_count",
    "publish_failed_count",
    "duration_ms",
    "backlog_remaining",
    "oldest_due_age_seconds",
    "max_lateness_seconds",
    "outbox_unpublished",
    "batch_size",
    "batches",
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
    # The design's liveness window. Every run that reaches the relay materializes the asset (even
    # one that dispatched nothing), so "stale" means no cycle got that far; the dispatch_liveness
    # check says whether one succeeded.
    freshness_policy=FreshnessPolicy.time_window(fail_window=FRESHNESS_FAIL_WINDOW),
)
