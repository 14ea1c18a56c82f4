"""Whether the notifications side has a reminder as delivered: a read of its de-duplication store.

For ``reminder-pipeline trace`` and the ``reminder_trace`` job: the store is opened through
:mod:`.dedup`'s public classes and asked :meth:`~.dedup.DedupStore.is_handled` only (every
notification of the reminder delivered). The check only reads: both stores are opened
``read_only`` (no prune, no schema created or upgraded, a SELECT-only login is enough). A SQLite
path that is not there, or a file that is not a store, is refused in one line and left as it is
(created empty it would answer "not delivered" for everything).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..config import ConfigError
from .dedup import DedupStoreError, PostgresDedupStore, SqliteDedupStore


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
    if not path.is_file():
        raise ConfigError(f"--dedup-path: {path} is not a file (the consumer's SQLite store)")
    try:
        local = SqliteDedupStore(path, read_only=True)
    except DedupStoreError as error:
        raise DedupStoreError(f"--dedup-path: {error}") from None
    with local:
        yield local.is_handled
