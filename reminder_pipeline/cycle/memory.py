"""How a long drain uses the garbage collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: The collector's young-generation threshold during a drain. A batch allocates ~10 objects per
#: row that live for the batch (rows, decisions, payloads); with the default 700 many survive two
#: collections and are promoted, and the full collections that follow walk the whole heap of a
#: process with Dagster loaded (benchmarks/README.md). Reference counting frees nearly all of it
#: anyway; cycles still get collected.
DRAIN_GEN0_THRESHOLD = 50_000


@contextmanager
def young_generation(threshold: int = DRAIN_GEN0_THRESHOLD) -> Iterator[None]:
    """Raise the young generation's threshold for the block (never lower it); restore it after."""
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= threshold:  # collector disabled, or already roomier
        yield
        return
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
