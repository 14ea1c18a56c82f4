"""A cycle's lateness summary: the same figures as one float per row, in a fixed size.

The write step hands its counts to the relay step through Dagster's stored step output (kept 14
days); the summary must give the ledger and the SLO check exactly what the per-row list gave.
"""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import asdict
from datetime import UTC, datetime

import pytest

from reminder_pipeline.cycle.records import Cycle, Written
from reminder_pipeline.domain.lateness import LATENESS_BUCKETS, Lateness, bucket_counts
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.messaging.relay import RelayResult
from reminder_pipeline.observability import ledger

#: The drain of the issue: 140,600 rows sent in one run (1.27 MB of step output as floats).
ROWS = 140_600


def _lateness(seed: int, n: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0, 200) for _ in range(n)]


def _drain(values: list[float], batch: int = 200) -> CycleCounts:
    """The counts of a drain: one batch's counts after another, as ``drain`` adds them."""
    total = CycleCounts()
    for start in range(0, len(values), batch):
        part = values[start : start + batch]
        total.add(CycleCounts(sent=len(part), batches=1, lateness=Lateness.of(part)))
    return total


def test_a_large_drains_step_output_stays_small():
    counts = _drain(_lateness(1, ROWS))
    written = Written("run-1", counts).plain()

    assert len(json.dumps(written)) < 2_000
    assert len(pickle.dumps(written)) < 2_000  # what the fs_io_manager stores
    assert len(pickle.dumps(Written("run-2", _drain(_lateness(2, 10))).plain())) == pytest.approx(
        len(pickle.dumps(written)), abs=100
    )


def test_the_summary_gives_the_figures_the_per_row_list_gave():
    values = [*_lateness(3, 20_000), 120.0, 1.0, 600.0, 600.5]
    counts = _drain(values)
    record = ledger.build_record("run-3", counts)

    assert record.lateness_count == len(values)
    assert record.lateness_sum == pytest.approx(sum(values), rel=1e-12)
    assert record.lateness_buckets == bucket_counts(values, LATENESS_BUCKETS)
    assert counts.max_lateness_seconds == max(values)
    p95 = ledger.quantile(0.95, record.lateness_buckets, LATENESS_BUCKETS)
    assert p95 == ledger.quantile(0.95, bucket_counts(values, LATENESS_BUCKETS), LATENESS_BUCKETS)


def test_a_step_output_goes_through_the_store_and_back():
    counts = _drain([5.0, 50.0, 500.0, float("nan")])
    again = Written.from_plain(json.loads(json.dumps(Written("run-4", counts).plain())))
    assert again.counts == counts
    assert again.counts.lateness.count == 3  # a non-finite value is not a measurement
    assert again.counts.max_lateness_seconds == 500.0


def test_a_step_output_stored_before_the_summary_is_still_read():
    # An old run's transition_and_outbox output (one float per row) re-executed after upgrade.
    old = {
        "run_id": "run-5",
        "counts": {
            **{k: v for k, v in asdict(CycleCounts(sent=3)).items() if k != "lateness"},
            "max_lateness_seconds": 70.0,
            "lateness_seconds": [10.0, 20.0, 70.0],
        },
        "relay": RelayResult().plain(),
    }
    from reminder_pipeline.defs.step_records import WrittenCycle

    cycle = Cycle("run-5", datetime(2026, 11, 30, 10, 0, tzinfo=UTC), 200)
    counts = WrittenCycle.read({"cycle": cycle.plain(), **old}).written.counts  # the Dagster edge
    assert counts.sent == 3
    assert counts.lateness == Lateness.of([10.0, 20.0, 70.0])
    assert counts.max_lateness_seconds == 70.0
