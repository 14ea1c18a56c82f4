"""SIGKILL at every step boundary of a real dispatcher process, then a clean cycle: nothing lost, nothing doubled.

The dispatcher runs as a separate process on the real PostgreSQL and broker; the survivor is a
plain cycle in the test process. Duplicates on the topic may come only from the relay's ack
window (killed after the broker acknowledged, before the outbox row was marked).
"""

from __future__ import annotations

import signal

import pytest

from .harness import check_invariants, final_clean_cycles, seed_mixed, spawn_worker
from .worker import POINTS


@pytest.mark.parametrize("point", POINTS)
def test_kill_at_each_step_boundary(
    point, engine, database_url, kafka_settings, publisher, kafka_reader
):
    scenario = seed_mixed(engine, 40, seed=len(point))
    worker = spawn_worker(
        database_url, kafka_settings.bootstrap_servers, crash_at=point, batch_size=30
    )
    try:
        out, _ = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == -signal.SIGKILL, f"worker did not reach {point}: {out}"
    assert f"crashing at {point}" in out

    as_of = final_clean_cycles(engine, publisher)
    verdict = check_invariants(engine, kafka_reader, scenario, as_of)
    assert verdict.sent > 0 and verdict.skipped > 0 and verdict.poison_pending > 0
    if point == "after_ack":
        assert 0 < verdict.duplicates <= 30  # at most the batch that was in the ack window
    else:
        assert verdict.duplicates == 0
