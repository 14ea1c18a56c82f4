"""Concurrent ``reminder_dispatch`` runs (several deployments, or a raised run limit) share the load.

Four runs, each in its own process with its own Dagster instance, are released together over 800
due rows on the real database and broker. Each run's ``select_due_batch`` reserves its rows until
its write commits, so the four take disjoint batches: one round moves (nearly) all 800, no
reminder gets a second outbox row, and every message reaches the topic once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline_tests.support import bulk_due, outbox_rows, reminders


def test_four_runs_started_together_take_disjoint_batches(
    engine, database_url, kafka_settings, publisher, kafka_reader
):
    bulk_due(engine, 800)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reminder_pipeline_tests.defs.dispatch_run_worker",
                database_url,
                kafka_settings.bootstrap_servers,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for _ in range(4)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # released together
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = [json.loads(worker.stdout.readline()) for worker in workers]
    finally:
        for worker in workers:
            worker.stdin.close()
            worker.wait(120)

    assert all(r["success"] for r in results), results
    moved = [r for r in reminders(engine) if r["status"] != "Pending"]
    assert len(moved) >= 720, [r["sent_count"] for r in results]
    assert sum(r["sent_count"] for r in results) == len(moved)
    # No row was taken twice: the runs' counts add up, and one outbox row per Sent row.
    rows = outbox_rows(engine)
    assert len(rows) == len({o["reminder_id"] for o in rows}) == len(moved)
    # What a relay that found the lock busy left for the next pass.
    publish_outbox(engine, publisher)
    ids = [r["id"] for r in moved]
    messages = kafka_reader.wait_for(ids, timeout=60)
    kafka_reader.drain()
    assert Counter(m.value["ReminderId"] for m in kafka_reader.for_reminders(ids)) == Counter(
        {str(i): 1 for i in ids}
    )
    assert len(messages) == len(ids)
