"""Profiling aid for the catch-up figure: ``python -m benchmarks._profile [--rows N] [--dagster]``.

Seeds a due backlog, runs one catch-up in this process (``run_cycle``, or a ``reminder_catch_up``
Dagster run) under cProfile with pg_stat_statements loaded, and prints the hottest Python
functions and SQL statements. cProfile sees the main thread only: for the relay thread, run it
under py-spy with ``--no-cprofile``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import time
from datetime import UTC, datetime

import psycopg

from benchmarks._infra import progress, servers
from benchmarks._seed import seed_backlog
from reminder_pipeline import cycle, logs
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--no-log", action="store_true", help="do not configure INFO logging")
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument(
        "--no-cprofile",
        action="store_true",
        help="no cProfile (e.g. under py-spy, which also sees the relay thread)",
    )
    parser.add_argument(
        "--dagster",
        action="store_true",
        help="run the drain as a reminder_catch_up Dagster run (in process, "
        "Dagster storage in PostgreSQL as dagster.yaml has it) instead of "
        "run_cycle",
    )
    parser.add_argument(
        "--relay-only",
        action="store_true",
        help="write the backlog to the outbox first (no publisher), then time the "
        "relay alone: what one relay lock publishes per second",
    )
    args = parser.parse_args()
    with servers(stat_statements=True) as srv:
        ensure_topic(srv.kafka)
        db = srv.create_database("profile")
        engine = make_engine(srv.url(db), pool_size=5)
        migrate.upgrade(engine)
        seed_backlog(srv.dsn(db), args.rows, datetime.now(UTC), progress)
        with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        if not args.no_log:
            logs.configure(logging.INFO, open(srv.workdir / "profile.jsonl", "a"))  # noqa: SIM115
        publisher = KafkaPublisher(srv.kafka)
        if args.relay_only:
            cycle.drain(
                engine, datetime.now(UTC), args.batch_size, max_batches=10_000, budget_seconds=3600
            )
            with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        if not args.no_cprofile:
            profiler.enable()
        if args.relay_only:
            relayed = publish_outbox(engine, publisher, budget_seconds=3600)
            c = CycleCounts(sent=relayed.published, published=relayed.published)
        elif args.dagster:
            c = _dagster_run(
                srv, db, args.batch_size, args.rows, profiler if not args.no_cprofile else None
            )
        else:
            c = cycle.run_cycle(
                engine,
                publisher,
                batch_size=args.batch_size,
                max_batches=10_000,
                budget_seconds=3600,
            ).counts
        profiler.disable()
        elapsed = time.perf_counter() - t0
        published = c.published
        what = (
            "relay alone"
            if args.relay_only
            else "reminder_catch_up"
            if args.dagster
            else "run_cycle"
        )
        print(
            f"{what}: {c.sent + c.skipped:,} rows in {elapsed:.2f}s = "
            f"{(c.sent + c.skipped) / elapsed:,.0f} rows/s (published {published})"
        )
        if not args.no_cprofile:
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(args.top)
            print(buf.getvalue())
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.top)
            print(buf.getvalue())
        with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
            rows = conn.execute(
                """SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 2),
                          rows, regexp_replace(left(query, 110), '\\s+', ' ', 'g')
                     FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                    ORDER BY total_exec_time DESC LIMIT 15"""
            ).fetchall()
        print("calls  total_ms  mean_ms  rows  query")
        for r in rows:
            print(f"{r[0]:>5} {r[1]:>9} {r[2]:>8} {r[3]:>6}  {r[4]}")
        publisher.close()
        engine.dispose()
    return 0


def _dagster_run(srv, db: str, batch_size: int, rows: int, profiler) -> CycleCounts:
    """``reminder_catch_up`` in this process, on an instance configured like dagster.yaml."""
    from dagster import instance_for_test

    from reminder_pipeline.definitions import defs
    from reminder_pipeline.defs.resources import KafkaResource, PostgresResource

    job = defs.resolve_job_def("reminder_catch_up")
    dagster_db = srv.create_database("profile_dagster")
    overrides = {
        "telemetry": {"enabled": False},
        "storage": {"postgres": {"postgres_url": srv.url(dagster_db, driver="psycopg2")}},
    }
    with instance_for_test(overrides=overrides) as instance:
        if profiler is not None:
            profiler.enable()
        result = job.execute_in_process(
            run_config={
                "batch_size": batch_size,
                "max_batches": rows // batch_size + 2,
                "budget_seconds": 240.0,
            },
            instance=instance,
            raise_on_error=True,
            resources={
                "postgres": PostgresResource(database_url=srv.url(db)),
                "kafka": KafkaResource(bootstrap_servers=srv.bootstrap_servers),
            },
        )
        [m] = result.asset_materializations_for_node("relay_outbox")
        entries = instance.all_logs(result.run_id)
        kinds: dict[str, int] = {}
        for e in entries:
            key = (
                e.dagster_event.event_type_value
                if e.is_dagster_event
                else (e.user_message or "").split(" ")[0:2]
            )
            kinds[str(key)] = kinds.get(str(key), 0) + 1
        progress(f"event-log entries: {len(entries)}: {kinds}")
    meta = {k: v.value for k, v in m.metadata.items()}
    return CycleCounts(
        sent=int(meta["sent_count"]),
        skipped=int(meta["skipped_count"]),
        published=int(meta["published_count"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
