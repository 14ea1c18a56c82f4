"""One member of the reference consumer on N messages already on the topic, next to a raw loop.

``python -m benchmarks.consumer [--messages N] [--stores sqlite,postgres] [--rounds R] [--json FILE]``
(issue 28). N reminder-due messages (contract v1, key = EventId, half with a client) are put on
a topic of 3 partitions first; then, in the same run and on the same servers:

* the raw loop: a confluent-kafka consumer in a fresh group that polls, parses each value as
  JSON and commits each poll's offsets synchronously (what the client library reads);
* the reference consumer (``ReminderConsumer``), one member, a sink that only counts, with the
  SQLite de-dup file and with the shared PostgreSQL store (the table made by
  ``docker/postgres/initdb/20-notifications-dedup.sh``, as compose makes it).

Each is timed from its first message (notification) to its last, ``--rounds`` times (default 3;
each round's ratio against that round's raw loop, judged on the median: the raw loop's 0.3-1.5 s
move by a third from run to run). Printed: notifications/s, the ratio to the raw loop (target >=
0.10x with either store) and each round's, the process's peak RSS during the run
(target <= 200 MB, flat with the backlog; each loop runs in a fresh process of its own, so
the figure is that loop's alone) and the load average. Logging is not configured, so
the per-reminder INFO lines cost nothing here (``consume`` writes them to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer

from benchmarks._infra import progress, servers
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.consumer import ConsumerOptions, ReminderConsumer
from reminder_pipeline.consumer.dedup import PostgresDedupStore, SqliteDedupStore
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.kafka import ensure_topic
from reminder_pipeline_testkit.dedup_store import dedup_database
from reminder_pipeline_testkit.servers import Servers

TARGET_RATIO = 0.10
TARGET_RSS_MB = 200


def start_in_an_hour() -> str:
    """The StartAt of the benchmark's messages: an hour from now, so none is dropped as passed."""
    return (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def contract_value(i: int, start: str) -> dict[str, Any]:
    """The ``i``-th benchmark message's value: the contract's fields, a client on every other."""
    return {
        "ReminderId": str(uuid.uuid4()),
        "EventId": str(uuid.uuid4()),
        "TenantId": str(uuid.uuid4()),
        "OwnerUserId": str(uuid.uuid4()),
        "ClientUserId": str(uuid.uuid4()) if i % 2 else None,
        "Kind": "Meeting",
        "StartAt": start,
        "TimeZone": "Europe/Moscow",
        "OffsetMinutes": 60,
        "AppointmentId": None,
    }


def fill_topic(kafka: KafkaSettings, topic: str, count: int) -> None:
    """``count`` contract messages on ``topic`` (due now, starting in an hour)."""
    ensure_topic(kafka, topic=topic)
    producer = Producer({**kafka.client_config(), "linger.ms": 20, "enable.idempotence": True})
    start = start_in_an_hour()
    for i in range(count):
        value = contract_value(i, start)
        reminder_id, event_id = value["ReminderId"], value["EventId"]
        headers = list(contract.headers(reminder_id, None).items())
        while True:
            try:
                producer.produce(
                    topic, key=event_id.encode(), value=json.dumps(value).encode(), headers=headers
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("messages not delivered to the broker")


class PeakRss(threading.Thread):
    """Samples this process's RSS every 0.2 s until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mb = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.halt.wait(0.2):
            self.peak_mb = max(self.peak_mb, me.memory_info().rss / 2**20)

    def __enter__(self) -> PeakRss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join()


def raw_loop(kafka: KafkaSettings, topic: str, count: int) -> tuple[float, float]:
    """(messages/s, peak RSS MB) of poll + JSON parse + a synchronous commit per poll."""
    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen, first, last = 0, 0.0, 0.0
    with PeakRss() as rss:
        deadline = time.monotonic() + 600
        while seen < count and time.monotonic() < deadline:
            messages = [m for m in consumer.consume(500, 1.0) if m.error() is None]
            if not messages:
                continue
            for message in messages:
                json.loads(message.value())
            consumer.commit(asynchronous=False)
            first = first or time.monotonic()
            seen += len(messages)
            last = time.monotonic()
    consumer.close()
    if seen < count:
        raise RuntimeError(f"raw loop read {seen} of {count}")
    return count / max(last - first, 1e-9), rss.peak_mb


class CountingSink:
    """Counts reminders fully notified (their owner's notification), stops the run at the last."""

    def __init__(self, count: int) -> None:
        self.count, self.seen = count, 0
        self.first = self.last = 0.0
        self.stop = threading.Event()

    def deliver(self, notification: Any) -> None:
        now = time.monotonic()
        self.first = self.first or now
        if notification.recipient_role == "owner":
            self.seen += 1
            self.last = now
            if self.seen >= self.count:
                self.stop.set()


def one_member(kafka: KafkaSettings, topic: str, count: int, store: Any) -> tuple[float, float]:
    """(notifications/s, peak RSS MB) of one ReminderConsumer member over the whole topic."""
    sink = CountingSink(count)
    options = ConsumerOptions(
        group_id=f"bench-member-{uuid.uuid4().hex[:8]}",
        topic=topic,
        dlq_topic=f"{topic}.dlq",
        drop_after_start_seconds=None,
    )
    ensure_topic(kafka, topic=options.dlq_topic)
    consumer = ReminderConsumer(kafka, sink, store, options)
    with PeakRss() as rss:
        thread = threading.Thread(target=consumer.run, kwargs={"stop": sink.stop}, daemon=True)
        thread.start()
        sink.stop.wait(1800)
        thread.join(60)
    if sink.seen < count:
        raise RuntimeError(f"the consumer notified {sink.seen} of {count}")
    return count / max(sink.last - sink.first, 1e-9), rss.peak_mb


def member_with_store(
    kafka: KafkaSettings, topic: str, count: int, store_name: str, where: str
) -> tuple[float, float]:
    """:func:`one_member` with its store opened here (``where``: the PostgreSQL URL or the
    SQLite path), as ``consume`` opens it in its own process."""
    with contextlib.ExitStack() as stack:
        if store_name == "postgres":
            store: Any = stack.enter_context(PostgresDedupStore(where))
        else:
            store = stack.enter_context(SqliteDedupStore(where))
        return one_member(kafka, topic, count, store)


def in_own_process(target: Any, *args: Any) -> tuple[float, float]:
    """``target(*args)`` in a fresh process, as a member or a raw loop runs on its own: its peak
    RSS is that loop's alone, not this process's (which filled the topic)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result: tuple[float, float] = pool.apply(target, args)
    return result


def measure(srv: Servers, count: int, stores: list[str], rounds: int) -> list[dict[str, Any]]:
    """Every round's rows: the raw loop, then one member per store, each in a process of its
    own and a group of its own over the same topic (a fresh store each time)."""
    topic = f"bench.reminder-due.{uuid.uuid4().hex[:8]}"
    progress(f"putting {count} messages on {topic}")
    fill_topic(srv.kafka, topic, count)
    rows: list[dict[str, Any]] = []
    for number in range(1, rounds + 1):
        progress(f"round {number}/{rounds}: raw confluent-kafka loop")
        raw_rate, raw_rss = in_own_process(raw_loop, srv.kafka, topic, count)
        rows.append(
            {
                "round": number,
                "loop": "raw",
                "per_s": round(raw_rate),
                "ratio": 1.0,
                "peak_rss_mb": round(raw_rss),
            }
        )
        for name in stores:
            progress(f"round {number}/{rounds}: one member, {name} store")
            with contextlib.ExitStack() as stack:
                if name == "postgres":
                    where = stack.enter_context(dedup_database(srv.admin_url))
                else:
                    where = str(srv.workdir / f"{topic}.{number}.sqlite3")
                rate, rss = in_own_process(member_with_store, srv.kafka, topic, count, name, where)
            rows.append(
                {
                    "round": number,
                    "loop": f"member/{name}",
                    "per_s": round(rate),
                    "ratio": round(rate / raw_rate, 3),
                    "peak_rss_mb": round(rss),
                }
            )
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per loop: the median rate and ratio over the rounds (each ratio against its own round's
    raw loop), the highest peak RSS, and the verdict on them."""
    result = []
    for loop in dict.fromkeys(row["loop"] for row in rows):
        mine = [row for row in rows if row["loop"] == loop]
        ratio = statistics.median(row["ratio"] for row in mine)
        rss = max(row["peak_rss_mb"] for row in mine)
        member = loop != "raw"
        result.append(
            {
                "loop": loop,
                "per_s": round(statistics.median(row["per_s"] for row in mine)),
                "ratio": round(ratio, 3),
                "ratios": [row["ratio"] for row in mine],
                "peak_rss_mb": rss,
                "result": (
                    ("PASS" if ratio >= TARGET_RATIO and rss <= TARGET_RSS_MB else "MISS")
                    if member
                    else ""
                ),
            }
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.consumer", description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000, help="messages on the topic")
    parser.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (judged on the median ratio)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    if not set(stores) <= {"sqlite", "postgres"} or args.messages < 1 or args.rounds < 1:
        parser.error("--stores takes sqlite and/or postgres; --messages and --rounds at least 1")
    load_before = os.getloadavg()
    with servers() as srv:
        rows = measure(srv, args.messages, stores, args.rounds)
    load_after = os.getloadavg()
    summary = medians(rows)
    print(
        f"{'loop':<16} {'per s':>7} {'ratio':>7} {'target':>7} {'peak RSS MB':>11} "
        f"{'result':>6}  ratio by round"
    )
    for row in summary:
        target = "" if row["loop"] == "raw" else f">={TARGET_RATIO:.2f}x"
        by_round = "" if row["loop"] == "raw" else " ".join(f"{r:.3f}" for r in row["ratios"])
        print(
            f"{row['loop']:<16} {row['per_s']:>7} {row['ratio']:>6.3f}x {target:>7} "
            f"{row['peak_rss_mb']:>11} {row['result']:>6}  {by_round}"
        )
    print(
        f"{args.messages} messages, {args.rounds} rounds (median; each ratio against its round's "
        f"raw loop); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"RSS target <= {TARGET_RSS_MB} MB"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "messages": args.messages,
                    "rounds": args.rounds,
                    "summary": summary,
                    "rows": rows,
                    "load": load_after,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
