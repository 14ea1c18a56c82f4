"""Whether the notifications side has a reminder as delivered: a read of its de-duplication store.

For ``reminder-pipeline trace`` and the ``reminder_trace`` job: the store is opened through
:mod:`.dedup`'s public classes and asked :meth:`~.dedup.DedupStore.is_handled` only (every
notification of the reminder delivered). A SQLite path that is not there is refused rather than
created empty (it would answer "not delivered" for everything).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..config import ConfigError
from .dedup import PostgresDedupStore, SqliteDedupStore


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
        with PostgresDedupStore(dedup_url) as shared:
            yield shared.is_handled
        return
    path = Path(str(dedup_path)).expanduser()
    if not path.is_file():
        raise ConfigError(f"--dedup-path: {path} is not a file (the consumer's SQLite store)")
    with SqliteDedupStore(path) as local:
        yield local.is_handled
