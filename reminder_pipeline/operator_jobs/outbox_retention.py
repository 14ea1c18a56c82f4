"""Outbox retention: published rows are purged after a retention, in small batches."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy.engine import Engine

from ..audit import audited, os_user
from ..config import DEFAULT_RETENTION_HOURS
from ..logs import RunLog
from ..store import outbox_repository

OUTBOX_RETENTION = timedelta(hours=DEFAULT_RETENTION_HOURS)


def purge_published(
    engine: Engine,
    retention: timedelta = OUTBOX_RETENTION,
    *,
    batch_size: int = 1000,
    budget_seconds: float = 60.0,
    operator: str | None = None,
    run_log: RunLog | None = None,
) -> int:
    """Delete published outbox rows older than ``retention``; a short transaction per batch.

    Unpublished rows are never touched, whatever their age: they are the relay's work. Audited
    before the first DELETE (an interrupted purge still leaves its line) and after.
    """
    deadline = time.monotonic() + budget_seconds
    total = 0
    with audited(
        "outbox purge",
        operator=operator or os_user(),
        action="outbox purge",
        run_log=run_log,
        retention_hours=retention.total_seconds() / 3600,
        batch_size=batch_size,
    ) as outcome:
        outcome.message = "outbox purged"
        while time.monotonic() < deadline:
            with engine.begin() as conn:
                deleted = outbox_repository.purge_published_outbox(
                    conn, retention.total_seconds(), batch_size
                )
            total += deleted
            outcome.fields["deleted"] = total
            if deleted < batch_size:
                break
        outcome.fields["deleted"] = total
    return total
