"""How a long batch loop uses the garbage collector: a drain's (``cycle/drain.py``) and a
consumer member's (``consumer/runner.py``), with one threshold (BATCH_LOOP_GEN0_THRESHOLD)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: A batch loop's young-generation threshold (a drain's, a consumer member's): a batch's objects
#: stay alive until it is recorded; the default 700 would walk and promote them over and over.
BATCH_LOOP_GEN0_THRESHOLD = 50_000


@contextmanager
def young_generation(threshold: int) -> Iterator[None]:
    """Raise the young generation's threshold for the block (never lower it); restore it after.

    A batch's objects live until the batch ends; with the default threshold (700) young
    collections walk them over and over and promote them, and the full collections that follow
    walk the whole heap. Reference counting frees nearly all of them anyway; cycles still get
    collected.
    """
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= threshold:  # collector disabled, or already roomier
        yield
        return
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
