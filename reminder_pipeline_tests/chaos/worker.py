"""A dispatcher process for the crash-point and chaos tests: the seed's steps, with a place to die.

``python -m reminder_pipeline_tests.chaos.worker DATABASE_URL BOOTSTRAP [--crash-at POINT] [--loop]``
runs the same plain steps the Dagster ops run, and SIGKILLs itself at POINT: after_select,
after_decide, before_commit, after_commit or after_ack (the broker acknowledged, the outbox row
is not yet marked). With ``--loop`` it keeps cycling until stdin closes or it is killed.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import uuid

from reminder_pipeline import cycle
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.messaging.kafka import KafkaPublisher
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_tests import oracle

POINTS = ("after_select", "after_decide", "before_commit", "after_commit", "after_ack")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("database_url")
    parser.add_argument("bootstrap_servers")
    parser.add_argument("--crash-at", choices=POINTS)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--loop", action="store_true")
    args = parser.parse_args()

    def crash(point: str) -> None:
        if point == args.crash_at:
            print(f"crashing at {point}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    engine = make_engine(args.database_url, pool_size=2)
    publisher = KafkaPublisher(KafkaSettings(args.bootstrap_servers))
    print("ready", flush=True)
    while True:
        run_id = f"chaos-{uuid.uuid4()}"
        as_of = cycle.now_utc()
        with engine.begin() as conn:
            selection = cycle.lock_due(conn, as_of, args.batch_size)
            crash("after_select")
            oracle.decide_batch(selection.rows)
            crash("after_decide")
            cycle.write_rows(conn, selection.rows, as_of, run_id=run_id)
            if selection.rows:
                crash("before_commit")
        if selection.rows:
            crash("after_commit")
        publish_outbox(
            engine,
            publisher,
            run_id=run_id,
            on_acknowledged=lambda ids: crash("after_ack") if ids else None,
        )
        if not args.loop:
            break
        if select.select([sys.stdin], [], [], 0.05)[0] and not sys.stdin.readline():
            break  # the parent closed our stdin: stop between cycles
    publisher.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
