"""The re-publish back-fill's figures: one DueAt day re-published, next to the relay publishing as many rows.

    python -m benchmarks.republish [--per-day N] [--days D] [--chunk-size C]

Starts its own embedded PostgreSQL + broker (or uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS, in a
scratch database), fills the outbox with ``--days`` days of ``--per-day`` messages each (contract
payloads and headers, due times spread over each day), and prints:

* baseline: the shipped relay (``relay_outbox``) publishing one day's rows while they are
  unpublished (read, produce, wait for acknowledgements, mark published), rows/s;
* re-publish: ``resend_day`` of the same day once it is published, rows/s and chunks;
* the live relay's wait: while the day is re-published, a relay pass every 0.2 s (as a dispatch
  cycle's would) takes the advisory lock; the longest and median wait for it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from benchmarks._infra import fmt_rate, progress, servers
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.messaging.relay_lock import relay_lock
from reminder_pipeline.operator_jobs.republish import Requester, day_window, resend_day
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

SEED = """
INSERT INTO outbox (topic, message_key, payload, headers, reminder_id, due_at, published_at)
SELECT 'pin.calendar.reminder-due.v1', ev::text,
       jsonb_build_object('ReminderId', rid, 'EventId', ev, 'TenantId', gen_random_uuid(),
                          'OwnerUserId', gen_random_uuid(), 'ClientUserId', NULL, 'Kind', 'Meeting',
                          'StartAt', to_char(due + interval '1 hour', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                          'TimeZone', 'Europe/Moscow', 'OffsetMinutes', 60, 'AppointmentId', NULL),
       jsonb_build_object('contract-version', '1', 'event-type', 'pin.calendar.reminder-due',
                          'reminder-id', rid, 'content-type', 'application/json',
                          'correlation-id', gen_random_uuid(),
                          'traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'),
       rid, due, CASE WHEN due >= :unpublished_from AND due < :unpublished_to THEN NULL ELSE now() END
  FROM (SELECT gen_random_uuid() AS rid, gen_random_uuid() AS ev,
               CAST(:first AS timestamptz) + g * interval '1 day' / :per_day AS due
          FROM generate_series(0, :total - 1) g) s
 ORDER BY due
"""


def _live_relay(engine, stop: threading.Event, waits: list[float]) -> None:
    """A relay pass every 0.2 s: how long it waits for the lock the back-fill takes per chunk."""
    while not stop.is_set():
        started = time.monotonic()
        with relay_lock(engine, 5.0) as conn:
            if conn is not None:
                waits.append(time.monotonic() - started)
        stop.wait(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.republish", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--per-day", type=int, default=50_000, help="messages per day")
    parser.add_argument("--days", type=int, default=7, help="days of outbox (the retention)")
    parser.add_argument("--chunk-size", type=int, default=500, help="re-publish chunk size")
    args = parser.parse_args(argv)
    now = datetime.now(UTC)
    first = datetime.combine((now - timedelta(days=args.days)).date(), datetime.min.time(), UTC)
    day = (now - timedelta(days=2)).date()
    start, end = day_window(day)
    with servers() as srv:
        engine = make_engine(srv.url(srv.create_database("republish")), pool_size=4)
        migrate.upgrade(engine)
        ensure_topic(srv.kafka)
        progress(f"seeding {args.days} days x {args.per_day:,} outbox rows")
        with engine.begin() as conn:
            conn.execute(
                sa.text(SEED),
                {
                    "first": first,
                    "per_day": args.per_day,
                    "total": args.days * args.per_day,
                    "unpublished_from": start,
                    "unpublished_to": end,
                },
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE outbox")
        publisher = KafkaPublisher(srv.kafka)
        try:
            t0 = time.monotonic()
            relayed = publish_outbox(engine, publisher, batch_size=1000, budget_seconds=3600)
            baseline = relayed.published / (time.monotonic() - t0)
            progress(f"baseline relay: {relayed.published:,} rows at {fmt_rate(baseline)}/s")

            stop, waits = threading.Event(), []
            live = threading.Thread(target=_live_relay, args=(engine, stop, waits))
            live.start()
            try:
                t0 = time.monotonic()
                report = resend_day(
                    engine, publisher, day, Requester("bench"), chunk_size=args.chunk_size
                )
                elapsed = time.monotonic() - t0
            finally:
                stop.set()
                live.join()
        finally:
            publisher.close()
            engine.dispose()
    rate = report.republished / elapsed
    print(
        f"one day of {args.per_day:,} messages ({args.days} days in the outbox), "
        f"chunk {args.chunk_size}"
    )
    print(f"  baseline, publish_outbox of the day's rows: {fmt_rate(baseline)}/s")
    print(
        f"  resend_day:                                {fmt_rate(rate)}/s "
        f"({report.republished:,} in {elapsed:.1f} s, {report.chunks} chunks; "
        f"{rate / baseline:.2f}x the relay)"
    )
    print(
        f"  live relay's wait for the lock meanwhile:  max {max(waits) * 1000:.0f} ms, "
        f"median {statistics.median(waits) * 1000:.0f} ms over {len(waits)} passes"
    )


if __name__ == "__main__":
    main()
