"""A drain: batch after batch, each its own transaction, published as it goes, within a budget."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from sqlalchemy.engine import Engine

from ..config import DEFAULT_CYCLE_BUDGET_SECONDS, DEFAULT_MAX_BATCHES
from ..domain.model import (
    CycleCounts,
)
from ..domain.writers import WRITER_IN_PROCESS
from ..logs import Journal
from ..memory import BATCH_LOOP_GEN0_THRESHOLD, young_generation
from ..messaging.relay import OutboxRelay, OutboxSpans, Publisher, RelayResult
from .batch import dispatch_batch
from .records import Progress
from .scan import DueScan, start_of_scan

#: Rows a drain may have handed to its relay and not yet published: twenty batches of 1,000, or
#: a hundred of 200 (the relay publishes what queued up in rounds of its batch size; ~25 MB at
#: most). Enough that a fresh idempotent producer does not hold the first batches of a drain
#: back: it is ready 0.5 or 1.0 s after it is created (librdkafka replaces the bootstrap broker
#: by the one the metadata names and asks for the producer id on its next 500 ms timer tick),
#: i.e. up to ~15,000 rows of a drain; a run creates its producer when it starts.
RELAY_QUEUE_ROWS = 20_000


def drain(
    engine: Engine,
    as_of: datetime,
    batch_size: int,
    *,
    max_batches: int = DEFAULT_MAX_BATCHES,
    budget_seconds: float = DEFAULT_CYCLE_BUDGET_SECONDS,
    run_id: str | None = None,
    publisher: Publisher | None = None,
    started: float | None = None,
    journal: Journal | None = None,
    progress: Progress | None = None,
    continuing: bool = False,
    written: OutboxSpans | None = None,
    writer: str = WRITER_IN_PROCESS,
    scan: DueScan | None = None,
) -> tuple[CycleCounts, RelayResult]:
    """Dispatch up to ``max_batches`` batches, each its own transaction.

    Stops early when a batch comes back short (nothing more is free to take), or when the
    budget (counted from ``started``, epoch seconds) is spent: what is left is the next cycle's,
    oldest first. With a publisher and more than one batch, a relay runs alongside
    (:meth:`OutboxRelay.start`): each committed batch's rows are handed to it and published
    while the next batch is written; its result is returned. ``continuing``: the cycle already
    wrote a batch, so a first look-up that finds nothing is not counted as a batch.
    ``written`` collects the outbox rows the drain wrote (what its cycle's relay must see out).
    ``writer``: who moves the rows (recorded on each, with ``run_id``; domain/writers.py).
    ``scan``: where the first batch's scan starts, carried from batch to batch and left where the
    drain stopped (:class:`~reminder_pipeline.cycle.scan.DueScan`); by default where a cycle
    would start now.
    """
    journal = journal or Journal()
    started = time.time() if started is None else started
    scan = scan if scan is not None else start_of_scan(engine)
    counts = CycleCounts()
    relay = None
    if publisher is not None and max_batches > 1:
        relay = OutboxRelay(engine, publisher, run_id=run_id)
        relay.start(
            deadline=time.monotonic() + max(started + budget_seconds - time.time(), 1.0),
            max_queued=max(2, RELAY_QUEUE_ROWS // batch_size),
        )
    try:
        with young_generation(BATCH_LOOP_GEN0_THRESHOLD):
            for number in range(max_batches):
                outcome = dispatch_batch(
                    engine,
                    as_of,
                    batch_size,
                    start=scan.position,
                    run_id=run_id,
                    journal=journal,
                    writer=writer,
                )
                scan.advance(
                    outcome.next_from or scan.position,
                    outcome.selected,
                    batch_size,
                    outcome.skipped_locked,
                )
                counts.add(outcome.counts())
                if not outcome.selected and (number or continuing):
                    # The look-up after a full batch that found nothing due is not a batch: a
                    # burst of 2,000 reads "10 batches" on the asset, not 11.
                    counts.batches -= 1
                if written is not None:
                    written.add(m.id for m in outcome.messages)
                if relay is not None:
                    relay.hand_over(outcome.messages)
                if progress is not None:
                    progress(counts)
                if outcome.selected < batch_size:
                    break
                if time.time() - started >= budget_seconds:
                    journal.event(
                        logging.WARNING,
                        "cycle budget spent; the rest waits for the next cycle",
                        run_id=run_id,
                        budget_seconds=budget_seconds,
                    )
                    break
    except BaseException:
        if relay is not None:
            relay.abandon()
        raise
    return counts, (relay.finish() if relay is not None else RelayResult())
