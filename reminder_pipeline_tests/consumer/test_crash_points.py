"""SIGKILL of a consumer member at each point of a batch, then a survivor: none lost, none twice.

A member runs as a separate process (``crash_worker.py``) on the real broker and a real store
and kills itself: after delivering a batch and before recording it, after recording and before
committing its offsets, or in the middle of a rebalance (a second member joining). A survivor in
the same group and on the same store (the shared PostgreSQL table, or the same host's SQLite
file) then takes every partition. Counted from the notifications actually delivered (a line per
notification, written before the sink returns):

* lost: 0 at every point, with either store;
* notified twice: 0 after recording and during a rebalance; after delivering and before
  recording, only that one batch again (the one window no store can close: the notification id,
  the same both times, is the channel's idempotency key for it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from reminder_pipeline.consumer import PostgresDedupStore, ReminderConsumer, SqliteDedupStore

from .crash_worker import POINTS, FileSink, options
from .lane import Lane, a_payload, committed, wait_until

MESSAGES = 30
DEADLINE = 120.0


def _lines(path: Path) -> list[tuple[str, str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines() if line]  # type: ignore[misc]


@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
@pytest.mark.parametrize("point", POINTS)
def test_a_member_killed_at_each_point_of_a_batch(
    point: str, store_kind: str, lane: Lane, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = (
        request.getfixturevalue("shared_dedup_url")
        if store_kind == "postgres"
        else str(tmp_path / "host.sqlite3")
    )
    out = tmp_path / "delivered.txt"
    payloads = [a_payload() for _ in range(MESSAGES)]
    for i, p in enumerate(payloads):
        lane.produce(p, partition=i % 3)
    wanted = {p["ReminderId"] for p in payloads}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reminder_pipeline_tests.consumer.crash_worker",
            point,
            lane.kafka.bootstrap_servers,
            lane.topic,
            lane.group_id,
            where,
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    stop = threading.Event()
    survivor_thread: threading.Thread | None = None
    store = PostgresDedupStore(where) if store_kind == "postgres" else SqliteDedupStore(where)
    try:
        if point == "during_rebalance":
            # The survivor joins once the worker has delivered something: the rebalance kills it.
            wait_until(
                lambda: bool(_lines(out)) or worker.poll() is not None,
                then=lambda: None,
                timeout=DEADLINE,
            )
            survivor_thread = _start_survivor(lane, store, out, stop)
        output, _ = worker.communicate(timeout=DEADLINE)
        assert worker.returncode == -signal.SIGKILL, f"worker did not crash at {point}: {output}"
        assert f"crashing at {point}" in output
        if survivor_thread is None:
            survivor_thread = _start_survivor(lane, store, out, stop)
        wait_until(
            lambda: (
                {r for r, _, _ in _lines(out)} >= wanted
                and committed(lane.kafka, lane.group_id, lane.topic) == {0: 10, 1: 10, 2: 10}
            ),
            then=lambda: None,
            timeout=DEADLINE,
        )
    finally:
        stop.set()
        if survivor_thread is not None:
            survivor_thread.join(timeout=60)
        if worker.poll() is None:
            worker.kill()
        store.close()
    lines = _lines(out)
    delivered = Counter((r, u) for r, u, _ in lines)
    assert {r for r, _ in delivered} == wanted  # none lost
    twice = {pair: n for pair, n in delivered.items() if n > 1}
    if point == "after_deliver":
        # Only the batch delivered and not recorded, once more, with the same notification id.
        assert twice and all(n == 2 for n in twice.values())
        ids = Counter((r, u, n) for r, u, n in lines)
        assert all(ids[(r, u, n)] == 2 for r, u, n in lines if (r, u) in twice)
    else:
        assert twice == {}


def _start_survivor(
    lane: Lane, store: object, out: Path, stop: threading.Event
) -> threading.Thread:
    opts = options(lane.topic, lane.group_id)
    member = ReminderConsumer(lane.kafka, FileSink(str(out)), store, opts)  # type: ignore[arg-type]
    thread = threading.Thread(target=member.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    return thread
