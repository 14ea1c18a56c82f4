"""Outbox retention: published rows are purged after a retention, in small batches."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from sqlalchemy.engine import Engine

from ..config import DEFAULT_RETENTION_HOURS
from ..logs import event
from ..store import repository

log = logging.getLogger(__name__)

DEFAULT_RETENTION = timedelta(hours=DEFAULT_RETENTION_HOURS)


def purge_outbox(
    engine: Engine,
    retention: timedelta = DEFAULT_RETENTION,
    *,
    batch_size: int = 1000,
    budget_seconds: float = 60.0,
) -> int:
    """Delete published outbox rows older than ``retention``; a short transaction per batch.

    Unpublished rows are never touched, whatever their age: they are the relay's work.
    """
    deadline = time.monotonic() + budget_seconds
    total = 0
    while time.monotonic() < deadline:
        with engine.begin() as conn:
            deleted = repository.purge_published_outbox(conn, retention.total_seconds(), batch_size)
        total += deleted
        if deleted < batch_size:
            break
    event(
        log,
        logging.INFO,
        "outbox purged",
        deleted=total,
        retention_hours=retention.total_seconds() / 3600,
    )
    return total
