"""Several dispatcher processes, a canceller and a killer over thousands of rows; then the invariants.

``CHAOS_SECONDS``, ``CHAOS_WORKERS`` and ``CHAOS_EVENTS`` size the run; the default suite runs a
short version, ``scripts/soak`` a long one (``pytest -m soak``).
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from datetime import timedelta

import pytest

from reminder_pipeline.local.calendar import CalendarError, cancel_event, reschedule_event

from ..support import utcnow
from .harness import check_invariants, final_clean_cycles, seed_mixed, spawn_worker


def _chaos(engine, database_url, kafka_settings, publisher, kafka_reader, seconds, workers, events):
    scenario = seed_mixed(engine, events, seed=11)
    rng = random.Random(5)
    stop = threading.Event()
    changed = {"cancelled": 0, "rescheduled": 0, "kills": 0}

    def calendar_user() -> None:
        while not stop.is_set():
            event_id = rng.choice(scenario.events)
            scenario.touched_events.add(event_id)
            try:
                if rng.random() < 0.5:
                    cancel_event(engine, event_id)
                    changed["cancelled"] += 1
                else:
                    shift = timedelta(minutes=rng.uniform(-30, 90))
                    reschedule_event(engine, event_id, utcnow() + shift)
                    changed["rescheduled"] += 1
            except CalendarError:
                pass
            stop.wait(0.05)

    def start() -> object:
        return spawn_worker(
            database_url, kafka_settings.bootstrap_servers, loop=True, batch_size=40
        )

    procs = [start() for _ in range(workers)]
    canceller = threading.Thread(target=calendar_user, daemon=True)
    canceller.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0)))  # the kill cadence itself
            victim = rng.randrange(len(procs))
            procs[victim].kill()
            procs[victim].wait()
            changed["kills"] += 1
            procs[victim] = start()
    finally:
        stop.set()
        canceller.join(timeout=30)
        for p in procs:
            if p.poll() is None:
                p.stdin.close()  # stop between cycles
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    as_of = final_clean_cycles(engine, publisher)
    verdict = check_invariants(engine, kafka_reader, scenario, as_of)
    print(f"chaos: {changed} {verdict}")
    assert changed["kills"] >= 1
    assert verdict.sent > 0
    return verdict


def test_parallel_dispatchers_with_kills_and_cancels(
    engine, database_url, kafka_settings, publisher, kafka_reader
):
    _chaos(
        engine,
        database_url,
        kafka_settings,
        publisher,
        kafka_reader,
        seconds=float(os.environ.get("CHAOS_SECONDS", "12")),
        workers=int(os.environ.get("CHAOS_WORKERS", "4")),
        events=int(os.environ.get("CHAOS_EVENTS", "600")),
    )


@pytest.mark.soak
def test_soak(engine, database_url, kafka_settings, publisher, kafka_reader):
    _chaos(
        engine,
        database_url,
        kafka_settings,
        publisher,
        kafka_reader,
        seconds=float(os.environ.get("CHAOS_SECONDS", "300")),
        workers=int(os.environ.get("CHAOS_WORKERS", "4")),
        events=int(os.environ.get("CHAOS_EVENTS", "5000")),
    )
