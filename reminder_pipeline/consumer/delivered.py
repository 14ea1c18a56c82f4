"""Whether the notifications side has a reminder as delivered: a read of its de-duplication store.

For ``reminder-pipeline trace`` and the ``reminder_trace`` job: the store is opened through
:mod:`.dedup`'s public classes and asked :meth:`~.dedup.DedupStore.is_handled` only (every
notification of the reminder delivered). The check only reads: both stores are opened
``read_only`` (no prune, no schema created or upgraded, a SELECT-only login is enough). A SQLite
path that is not there, or a file that is not a store, is refused in one line and left as it is
(created empty it would answer "not delivered" for everything). Given neither, a trace asks the
store ``consume`` writes with the same settings when it is there (:func:`found_store`: the
local stack's consumer, under ``REMINDER_PIPELINE_HOME``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..config import (
    CONSUMER_DEDUP_PATH_ENV,
    CONSUMER_DEDUP_URL_ENV,
    CONSUMER_GROUP_ID_ENV,
    ConfigError,
    Settings,
)
from .dedup import DedupStoreError, PostgresDedupStore, SqliteDedupStore
from .main import sqlite_store_path
from .options import DEFAULT_GROUP_ID


def consumers_file(settings: Settings) -> Path | None:
    """The SQLite store ``consume`` writes with these settings (``REMINDER_CONSUMER_DEDUP_PATH``,
    else its group's file under ``REMINDER_PIPELINE_HOME``), whether or not it is there yet;
    None when ``consume`` keeps a shared store instead (``REMINDER_CONSUMER_DEDUP_URL``)."""
    env = settings.env
    given = (env.get(CONSUMER_DEDUP_PATH_ENV) or "").strip()
    return sqlite_store_path(
        settings,
        (env.get(CONSUMER_GROUP_ID_ENV) or "").strip() or DEFAULT_GROUP_ID,
        Path(given).expanduser().resolve() if given else None,
        (env.get(CONSUMER_DEDUP_URL_ENV) or "").strip() or None,
    )


def found_store(settings: Settings) -> Path | None:
    """The store a trace asks when it is given none: :func:`consumers_file` when it is there
    (the local stack's consumer has written it), else None (nothing to ask)."""
    path = consumers_file(settings)
    return path if path is not None and path.is_file() else None


@contextmanager
def delivered_check(
    dedup_url: str | None, dedup_path: str | None
) -> Iterator[Callable[[uuid.UUID], bool] | None]:
    """The store's "fully delivered" check for the block, or None when neither is given."""
    if dedup_url and dedup_path:
        raise ConfigError("give --dedup-url or --dedup-path, not both")
    if not (dedup_url or dedup_path):
        yield None
        return
    if dedup_url:
        with PostgresDedupStore(dedup_url, read_only=True) as shared:
            yield shared.is_handled
        return
    path = Path(str(dedup_path)).expanduser()
    if not path.is_file():  # a state of this host, not a malformed option: exit 1
        raise DedupStoreError(f"--dedup-path: {path} is not a file (the consumer's SQLite store)")
    try:
        local = SqliteDedupStore(path, read_only=True)
    except DedupStoreError as error:
        raise DedupStoreError(f"--dedup-path: {error}") from None
    with local:
        yield local.is_handled
