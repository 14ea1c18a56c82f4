"""The cycle's clock: the database's, read once per cycle; this host's only for durations.

A host whose clock differs from the database's is logged and counted, never trusted
(docs/design.md, "One clock").
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy.engine import Engine

from .. import config
from ..store import repository

# A host whose clock differs from the database's by more than CLOCK_SKEW_WARN_SECONDS (defined
# with the ledger that counts such cycles) is logged and counted; its clock is never used for
# what is due or for what a cycle writes: the database's is.


def now_utc() -> datetime:
    """This host's clock, in UTC (durations and tests; a cycle's times are the database's)."""
    return datetime.now(UTC)


def database_now(engine: Engine) -> datetime:
    """The database server's clock now."""
    with engine.connect() as conn:
        return repository.database_clock(conn)


def read_clock(engine: Engine) -> tuple[datetime, float]:
    """The database's clock, and how far this host's is ahead of it (seconds, + = fast)."""
    before = time.time()
    now = database_now(engine)
    after = time.time()
    # The query's round trip is split evenly: the server read its clock somewhere in between.
    return now, (before + after) / 2 - now.timestamp()


def as_of_or_now(as_of: datetime | None, now: datetime) -> datetime:
    """Default ``as_of`` to ``now`` (the database's clock); refuse a naive or future one
    (``config.check_as_of``'s lines)."""
    return config.check_as_of(as_of, now=now) or now


def check_as_of_on_database(
    engine: Engine, as_of: datetime | None, name: str = "as_of"
) -> datetime | None:
    """An operator's AsOf checked against the database's clock (None: now, at the cycle's start).

    Where it is given (the CLI, the run config) the host's clock may be off either way; a slow
    host must not refuse an AsOf the database's clock accepts, nor a fast one take a future one.
    """
    if as_of is None:
        return None
    return config.check_as_of(as_of, name, now=database_now(engine))
