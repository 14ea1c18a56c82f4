"""A process of the benchmark: a catch-up by our pipeline (``run_cycle``, or a ``reminder_catch_up``
Dagster run), the raw set-based limit, or one ``reminder_dispatch`` run.

``python -m benchmarks._worker '<json options>'`` imports and connects, prints ``ready``, waits
for a ``go`` line on stdin (so several workers start together and imports are not timed), runs,
and prints ``result {json}``: rows, timings, and its own peak RSS (``ru_maxrss``).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
import uuid
from datetime import UTC, datetime

import psutil


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _wait_go() -> None:
    print("ready", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(3)


def _json_log(opts: dict) -> None:
    """As the CLI and a run worker do: JSON lines at INFO (one per reminder), here into a file."""
    from reminder_pipeline import logs

    if opts.get("log_file"):
        logs.configure(logging.INFO, open(opts["log_file"], "a", buffering=1 << 16))  # noqa: SIM115


# --- our pipeline ---------------------------------------------------------------------------


def run_pipeline(opts: dict) -> dict:
    from reminder_pipeline import cycle
    from reminder_pipeline.config import KafkaSettings
    from reminder_pipeline.messaging.kafka import KafkaPublisher
    from reminder_pipeline.store.engine import make_engine

    _json_log(opts)
    engine = make_engine(opts["url"], pool_size=5, application_name="bench-pipeline")
    publisher = KafkaPublisher(KafkaSettings(opts["bootstrap"]))
    with engine.connect() as conn:  # open a pooled connection before the clock starts
        conn.exec_driver_sql("SELECT 1")
    rss_before = _rss_mb()
    _wait_go()
    started_wall = time.time()
    t0 = time.perf_counter()
    report = cycle.run_cycle(
        engine,
        publisher,
        batch_size=opts["batch_size"],
        max_batches=opts["max_batches"],
        budget_seconds=opts["budget_seconds"],
    )
    elapsed = time.perf_counter() - t0
    ended_wall = time.time()
    left = publisher.close()
    engine.dispose()
    c = report.counts
    return {
        "mode": "pipeline",
        "rows": c.sent + c.skipped,
        "sent": c.sent,
        "skipped": c.skipped,
        "failed": c.failed,
        "skipped_locked": c.skipped_locked,
        "published": report.relay.published,
        "publish_failed": report.relay.failed,
        "relay_busy": report.relay.busy,
        "batches": c.batches,
        "backlog_remaining": report.backlog_remaining,
        "undelivered_at_close": left,
        "elapsed_s": elapsed,
        "started_wall": started_wall,
        "ended_wall": ended_wall,
        "rss_before_mb": rss_before,
        "rss_end_mb": _rss_mb(),
        "peak_rss_mb": _peak_mb(),
    }


# --- the same drain as a Dagster run ------------------------------------------------------------


def run_dagster(opts: dict) -> dict:
    """``reminder_catch_up`` executed in this process (its in-process executor) on a throwaway
    instance with its storage in PostgreSQL, as dagster.yaml has it; the ops write the cycle's
    records into the run's event log through their journal (``logs.FoldingJournal``), and the JSON
    log gets every line, as a run worker's stderr would. Timed from ``execute_in_process`` to its
    return: the run's own overhead (event log, step outputs, the materialization) included, the
    run worker's start excluded."""
    from dagster import instance_for_test

    from reminder_pipeline.definitions import defs
    from reminder_pipeline.defs.resources import KafkaResource, PostgresResource

    # reminder_catch_up, or the scheduled job itself (reminder_dispatch, its budget at most 90 s).
    job_name = opts.get("job", "reminder_catch_up")
    job = defs.resolve_job_def(job_name)
    budget_cap = 90.0 if job_name == "reminder_dispatch" else 240.0
    resources = {
        "postgres": PostgresResource(database_url=opts["url"]),
        "kafka": KafkaResource(bootstrap_servers=opts["bootstrap"]),
    }
    _json_log(opts)
    overrides: dict = {"telemetry": {"enabled": False}}
    if opts.get("dagster_pg_url"):  # Dagster's storage in PostgreSQL, as dagster.yaml has it
        overrides["storage"] = {"postgres": {"postgres_url": opts["dagster_pg_url"]}}
    with instance_for_test(overrides=overrides) as instance:
        rss_before = _rss_mb()
        _wait_go()
        started_wall = time.time()
        t0 = time.perf_counter()
        result = job.execute_in_process(
            run_config={
                "batch_size": opts["batch_size"],
                "max_batches": opts["max_batches"],
                "budget_seconds": min(opts["budget_seconds"], budget_cap),
            },
            instance=instance,
            resources=resources,
            raise_on_error=True,
        )
        elapsed = time.perf_counter() - t0
        ended_wall = time.time()
        [materialization] = result.asset_materializations_for_node("relay_outbox")
        meta = {k: v.value for k, v in materialization.metadata.items()}
        events = len(instance.all_logs(result.run_id))
    sent, skipped = int(meta["sent_count"]), int(meta["skipped_count"])
    return {
        "mode": opts["mode"],
        "job": job_name,
        "rows": sent + skipped,
        "sent": sent,
        "skipped": skipped,
        "published": int(meta["published_count"]),
        "batches": int(meta.get("batches", 0)),
        "event_log_entries": events,
        "elapsed_s": elapsed,
        "started_wall": started_wall,
        "ended_wall": ended_wall,
        "rss_before_mb": rss_before,
        "rss_end_mb": _rss_mb(),
        "peak_rss_mb": _peak_mb(),
    }


# --- one reminder_dispatch run, as one of several deployments started together --------------------


def run_dispatch(opts: dict) -> dict:
    """One ``reminder_dispatch`` run of one batch (``max_batches: 1``) on an instance of its own, as a
    separate deployment (or one of N runs a raised concurrency limit lets go) would run it."""
    from dagster import DagsterInstance

    from reminder_pipeline.defs.jobs import reminder_dispatch
    from reminder_pipeline.defs.resources import KafkaResource, PostgresResource

    resources = {
        "postgres": PostgresResource(database_url=opts["url"]),
        "kafka": KafkaResource(bootstrap_servers=opts["bootstrap"]),
    }
    _json_log(opts)
    instance = DagsterInstance.ephemeral()
    rss_before = _rss_mb()
    _wait_go()
    started_wall = time.time()
    t0 = time.perf_counter()
    result = reminder_dispatch.execute_in_process(
        # One batch: figure 6 measures how runs started together share a round.
        run_config={"batch_size": opts["batch_size"], "max_batches": 1},
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    elapsed = time.perf_counter() - t0
    [materialization] = result.asset_materializations_for_node("relay_outbox")
    meta = {k: v.value for k, v in materialization.metadata.items()}
    sent, skipped = int(meta["sent_count"]), int(meta["skipped_count"])
    return {
        "mode": "dispatch",
        "success": result.success,
        "rows": sent + skipped,
        "sent": sent,
        "skipped": skipped,
        "skipped_locked": int(meta["skipped_locked_count"]),
        "published": int(meta["published_count"]),
        "elapsed_s": elapsed,
        "started_wall": started_wall,
        "ended_wall": time.time(),
        "rss_before_mb": rss_before,
        "peak_rss_mb": _peak_mb(),
    }


# --- the raw set-based limit ----------------------------------------------------------------

# The raw limit of a catch-up, exactly as issue 13 ("Scale out") specifies it: its own SQL by
# definition, not the shipped statements. One set-based statement per batch of 1,000 that locks the
# oldest due rows (SKIP LOCKED), moves them Sent/Skipped from their event's status and inserts one
# outbox row per Sent row (the same columns ours writes) with the JSON payload and headers built in
# SQL, returning the rows to produce; then an idempotent acks=all producer, flush, mark published.
# Serial, one connection, and nothing per batch that only the baseline pays: the connection is in
# autocommit, so each statement is its own transaction in one round trip (an explicit transaction
# around one statement added a BEGIN and a COMMIT round trip to both statements of every batch);
# the reports are served by flush() alone (no poll(0) per message, which ours does not do either);
# the headers come back as text[] (the stored values, in HEADER_KEYS order), not as jsonb that
# Python would parse back into a dict for every row. The ids go through ARRAY(...) so the UPDATE
# keeps a primary-key index scan.
RAW_BATCH = """
WITH due AS (
    SELECT r.id
      FROM event_reminders r
     WHERE r.status = 'Pending'
       AND r.due_at < %(as_of)s
       AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= %(as_of)s)
     ORDER BY r.due_at
     LIMIT %(batch)s
       FOR UPDATE OF r SKIP LOCKED
),
moved AS (
    UPDATE event_reminders r
       SET status = CASE WHEN e.status IN ('Planned', 'InProgress') THEN 'Sent' ELSE 'Skipped' END,
           sent_at = CASE WHEN e.status IN ('Planned', 'InProgress')
                          THEN GREATEST(now(), %(as_of)s) END,
           updated_at = now(), last_error = NULL, next_attempt_at = NULL
      FROM calendar_events e
     WHERE r.id = ANY (ARRAY(SELECT id FROM due))
       AND e.id = r.calendar_event_id
       AND r.status = 'Pending'
    RETURNING r.id, r.status, r.offset_minutes, r.due_at, e.id AS event_id, e.tenant_id,
              e.owner_user_id, e.client_user_id, e.kind, e.start_at, e.time_zone, e.appointment_id
),
ins AS (
    INSERT INTO outbox (topic, message_key, payload, headers, reminder_id, due_at)
    SELECT %(topic)s, m.event_id::text,
           jsonb_build_object(
               'ReminderId', m.id::text, 'EventId', m.event_id::text,
               'TenantId', m.tenant_id::text, 'OwnerUserId', m.owner_user_id::text,
               'ClientUserId', m.client_user_id::text, 'Kind', m.kind,
               'StartAt', to_char(m.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'TimeZone', m.time_zone, 'OffsetMinutes', m.offset_minutes,
               'AppointmentId', m.appointment_id::text),
           jsonb_build_object(
               'contract-version', '1', 'event-type', 'pin.calendar.reminder-due',
               'reminder-id', m.id::text, 'content-type', 'application/json',
               'correlation-id', CAST(%(run_id)s AS text)),
           m.id, m.due_at
      FROM moved m
     WHERE m.status = 'Sent'
     ORDER BY m.due_at
    RETURNING id, message_key, CAST(payload AS text) AS payload,
              ARRAY[headers->>'contract-version', headers->>'event-type', headers->>'reminder-id',
                    headers->>'content-type', headers->>'correlation-id'] AS headers
)
SELECT c.n, i.id, i.message_key, i.payload, i.headers
  FROM (SELECT count(*) AS n FROM moved) AS c
  LEFT JOIN ins AS i ON true
 ORDER BY i.id
"""

#: The order of the header values RAW_BATCH returns.
HEADER_KEYS = ("contract-version", "event-type", "reminder-id", "content-type", "correlation-id")

RAW_MARK = "UPDATE outbox SET published_at = now() WHERE id = ANY(%s) AND published_at IS NULL"


def run_raw(opts: dict) -> dict:
    import psycopg
    from confluent_kafka import Producer

    from reminder_pipeline.domain import contract

    dsn = opts["dsn"]
    # Autocommit: each of the batch's two statements is its own transaction, one round trip each.
    conn = psycopg.connect(dsn, application_name="bench-raw", autocommit=True)
    producer = Producer(
        {
            "bootstrap.servers": opts["bootstrap"],
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "none",
        }
    )
    producer.list_topics(timeout=10)  # connect before the clock starts
    rss_before = _rss_mb()
    _wait_go()
    as_of = datetime.now(UTC)
    run_id = str(uuid.uuid4())
    rows = sent = published = failed = batches = 0
    db_s = produce_s = mark_s = 0.0
    started_wall = time.time()
    t0 = time.perf_counter()
    while True:
        ta = time.perf_counter()
        result = conn.execute(
            RAW_BATCH,
            {
                "as_of": as_of,
                "batch": opts["batch_size"],
                "topic": contract.TOPIC,
                "run_id": run_id,
            },
        ).fetchall()
        tb = time.perf_counter()
        db_s += tb - ta
        moved = int(result[0][0]) if result else 0
        messages = [r for r in result if r[1] is not None]
        rows += moved
        sent += len(messages)
        batches += 1
        errors: dict[int, str | None] = {}
        for _, oid, key, payload, values in messages:

            def report(err, _msg, oid=oid, errors=errors):
                errors[oid] = None if err is None else str(err)

            while True:
                try:
                    producer.produce(
                        contract.TOPIC,
                        key=key.encode(),
                        value=payload.encode(),
                        headers=[(k, v.encode()) for k, v in zip(HEADER_KEYS, values, strict=True)],
                        on_delivery=report,
                    )
                    break
                except BufferError:  # the local queue is full: serve reports, then retry
                    producer.poll(0.05)
        producer.flush(30)
        tc = time.perf_counter()
        produce_s += tc - tb
        ok = [oid for oid, err in errors.items() if err is None]
        failed += len(messages) - len(ok)
        if ok:
            conn.execute(RAW_MARK, (ok,))
        published += len(ok)
        mark_s += time.perf_counter() - tc
        if moved < opts["batch_size"]:
            break
    elapsed = time.perf_counter() - t0
    ended_wall = time.time()
    conn.close()
    return {
        "mode": "raw",
        "rows": rows,
        "sent": sent,
        "skipped": rows - sent,
        "published": published,
        "publish_failed": failed,
        "batches": batches,
        "elapsed_s": elapsed,
        "db_s": db_s,
        "produce_s": produce_s,
        "mark_s": mark_s,
        "started_wall": started_wall,
        "ended_wall": ended_wall,
        "rss_before_mb": rss_before,
        "rss_end_mb": _rss_mb(),
        "peak_rss_mb": _peak_mb(),
    }


def main() -> int:
    opts = json.loads(sys.argv[1])
    mode = opts["mode"]
    runners = {
        "pipeline": run_pipeline,
        "raw": run_raw,
        "dagster": run_dagster,
        "dispatch_job": run_dagster,
        "dispatch": run_dispatch,
    }
    result = runners[mode](opts)
    result["pid"] = os.getpid()
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
