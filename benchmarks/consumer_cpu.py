"""CPU time of the reference consumer per message, without servers: ``python -m benchmarks.consumer_cpu``.

``[--messages N] [--batch N] [--rounds R] [--log] [--profile]`` (issue 28). The messages
``benchmarks.consumer`` puts on its topic (contract v1, half with a client) are built in memory as
``confluent_kafka.Message`` objects and handed to :meth:`MessageHandling.handle_batch` in batches
of one partition, with the SQLite de-dup file in a temp dir and a sink that only counts: all of
the consumer's Python work per message (reading, the store's question and write, delivering,
metrics, logs) and none of the broker's. ``time.process_time`` over each round, divided by N:
CPU seconds, so a loaded machine slows it far less than a wall-clock rate (the median of the
rounds is printed). ``--log`` writes the JSON log lines at INFO (to /dev/null), as ``consume``
writes them to stderr. ``--profile`` prints cProfile's hottest functions of one more round.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from benchmarks.consumer import contract_value, start_in_an_hour
from reminder_pipeline import logs
from reminder_pipeline.consumer.dead_letters import DeadLetters
from reminder_pipeline.consumer.dedup import SqliteDedupStore
from reminder_pipeline.consumer.handling import MessageHandling
from reminder_pipeline.consumer.metrics import ConsumerMetrics
from reminder_pipeline.consumer.options import ConsumerOptions, ConsumeStats
from reminder_pipeline.consumer.texts import Locale
from reminder_pipeline.domain import contract
from reminder_pipeline.memory import BATCH_LOOP_GEN0_THRESHOLD, young_generation


def messages(count: int, partition: int = 0) -> list[Message]:
    """``count`` contract messages as ``benchmarks.consumer`` produces them (half with a client)."""
    start = start_in_an_hour()
    now_ms = int(time.time() * 1000)
    result = []
    for i in range(count):
        value = contract_value(i, start)
        reminder_id, event_id = value["ReminderId"], value["EventId"]
        headers: list[tuple[str, str | bytes | None]] = [
            (k, v.encode()) for k, v in contract.headers(reminder_id, None).items()
        ]
        result.append(
            Message(
                topic="bench.reminder-due",
                partition=partition,
                offset=i,
                key=event_id.encode(),
                value=json.dumps(value).encode(),
                headers=headers,
                timestamp=(TIMESTAMP_CREATE_TIME, now_ms),
            )
        )
    return result


class CountingSink:
    def __init__(self) -> None:
        self.delivered = 0

    def deliver(self, notification: Any) -> None:
        self.delivered += 1


def one_round(batches: list[list[Message]], workdir: Path) -> tuple[float, int]:
    """(CPU seconds, notifications) of handling ``batches`` with a fresh store and metrics."""
    options = ConsumerOptions(drop_after_start_seconds=None)
    stats, metrics, sink = ConsumeStats(), ConsumerMetrics(), CountingSink()
    path = workdir / f"{uuid.uuid4().hex}.sqlite3"
    with SqliteDedupStore(path) as store:
        # Nothing is dead-lettered here: the producer is never created.
        dead_letters = DeadLetters(None, options, stats, metrics)  # type: ignore[arg-type]
        handling = MessageHandling(sink, store, options, Locale.EN, stats, metrics, dead_letters)
        # The young GC generation a running member has (ReminderConsumer.run).
        with young_generation(BATCH_LOOP_GEN0_THRESHOLD):
            started = time.process_time()
            for batch in batches:
                outcome = handling.handle_batch(batch)
                assert outcome.retry is None and outcome.done == len(batch), outcome
            spent = time.process_time() - started
    return spent, sink.delivered


@contextlib.contextmanager
def _logged(enabled: bool) -> Iterator[None]:
    """The package's JSON lines at INFO to /dev/null while enabled, as ``consume`` logs them."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("reminder_pipeline")
    level = logger.level
    with open(os.devnull, "w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logs.JsonFormatter())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.consumer_cpu", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2000, help="messages per partition batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log", action="store_true", help="JSON log lines at INFO, to /dev/null")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--messages, --batch and --rounds take at least 1")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rp-consumer-cpu-") as tmp, _logged(args.log):
        workdir = Path(tmp)
        rounds = []
        for _ in range(args.rounds):
            # New ids each round: every message is notified (none is a duplicate).
            sample = messages(args.messages)
            batches = [sample[i : i + args.batch] for i in range(0, len(sample), args.batch)]
            spent, delivered = one_round(batches, workdir)
            rounds.append(spent / args.messages * 1e6)
        median = statistics.median(rounds)
        print(
            f"{args.messages} messages, batches of {args.batch}, {delivered} notifications a round"
            f"{', INFO lines logged' if args.log else ''};"
            f" CPU per message: median {median:.1f} us (rounds: "
            + ", ".join(f"{r:.1f}" for r in rounds)
            + f"); load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
        )
        if args.profile:
            sample = messages(args.messages)
            batches = [sample[i : i + args.batch] for i in range(0, len(sample), args.batch)]
            profiler = cProfile.Profile()
            profiler.enable()
            one_round(batches, workdir)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
            print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
