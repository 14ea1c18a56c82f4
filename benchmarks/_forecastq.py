"""The forecast's query at ``--rows`` rows: ``python -m benchmarks._forecastq [--rows N] [-n N]``.

On the due query's data set (``seed_history``: half the rows in the past, Sent/Skipped but one in
``k`` left Pending; half in the next 30 days, Pending), plus a tenant's bulk import planted on one
minute 15 hours ahead (not vacuumed, as it would be): ``EXPLAIN (ANALYZE, BUFFERS)`` of
``DUE_PER_MINUTE`` over 24 hours (the check's and the exporter's window) and over 168 hours (the
CLI's widest), the same counts as one ``GROUP BY date_trunc('minute', due_at)`` for comparison
(it sorts every row of the range), and the client-side time of the whole
``observability.forecast.read`` (three statements) for both horizons.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from benchmarks._dueq import INDEX_NAME, percentile
from benchmarks._infra import progress
from benchmarks._seed import _bind, seed_history
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline.observability import forecast
from reminder_pipeline.store import forecast as store
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.servers import Servers

PLANT = """
    WITH ev AS (
        INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
        SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task',
               CAST(%(minute)s AS timestamptz) + interval '1 hour', 'UTC'
          FROM generate_series(1, %(n)s)
        RETURNING id
    )
    INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
    SELECT gen_random_uuid(), id, 60, CAST(%(minute)s AS timestamptz) + random() * interval '59 s'
      FROM ev
"""


#: The obvious form, for comparison: one range scan, then a sort of every row by minute.
GROUPED = """
    SELECT date_trunc('minute', due_at) AS minute, count(*) AS due
      FROM event_reminders
     WHERE status = 'Pending' AND due_at >= :start AND due_at < :until
     GROUP BY 1
     ORDER BY 1
"""


def explain(conn: psycopg.Connection, hours: int, statement: str | None = None) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the per-minute counts over ``hours`` from this minute."""
    start = conn.execute("SELECT date_trunc('minute', now())").fetchone()[0]
    sql, params = _bind(
        statement or str(store.DUE_PER_MINUTE),
        {"start": start, "until": start + timedelta(hours=hours)},
    )
    with conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params, prepare=False)
        return [r[0] for r in rows.fetchall()]


def series(url: str, hours: int, n: int) -> dict:
    """Client-side milliseconds of ``forecast.read`` (SQLAlchemy, one transaction each)."""
    engine = make_engine(url, pool_size=1)
    times: list[float] = []
    peak = None
    with engine.connect() as conn:
        for i in range(n + 3):
            with conn.begin():
                t0 = time.perf_counter()
                ahead = forecast.read(conn, hours)
                if i >= 3:
                    times.append((time.perf_counter() - t0) * 1000)
            peak = ahead.peak
    engine.dispose()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(percentile(times, 99), 1),
        "peak_due": peak[1] if peak else None,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--peak", type=int, default=30_000)
    p.add_argument("-n", type=int, default=30)
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rp-forecastq-"))
    pg = EmbeddedPostgres(data_dir=workdir / "data", port=free_port())
    pg.start()
    out: dict = {"rows": args.rows, "planted_peak": args.peak}
    try:
        srv = Servers(pg.url("postgres"), "127.0.0.1:1", workdir, embedded=True)
        db = srv.create_database("forecastq")
        engine = make_engine(srv.url(db), pool_size=1)
        migrate.upgrade(engine)
        engine.dispose()
        gen = seed_history(srv.dsn(db), args.rows, 5_000, datetime.now(UTC), progress)
        out["generation_s"] = round(gen["total_s"])
        progress(f"forecast query: {gen['rows']:,} rows in {gen['total_s']:.0f}s")
        with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
            minute = conn.execute(
                "SELECT date_trunc('minute', now()) + interval '15 hours'"
            ).fetchone()[0]
            conn.execute(PLANT, {"minute": minute, "n": args.peak})
            out["pending_next_24h"] = conn.execute(
                "SELECT count(*) FROM event_reminders WHERE status = 'Pending' "
                "AND due_at >= now() AND due_at < now() + interval '24 hours'"
            ).fetchone()[0]
            for hours in (24, 168):
                lines = explain(conn, hours)
                out[f"explain_{hours}h"] = lines
                out[f"uses_index_{hours}h"] = any(INDEX_NAME in line for line in lines)
                progress(f"forecast query {hours} h:\n  " + "\n  ".join(lines))
            grouped = explain(conn, 24, GROUPED)
            out["explain_grouped_24h"] = grouped
            progress("GROUP BY date_trunc, 24 h:\n  " + "\n  ".join(grouped))
        for hours in (24, 168):
            out[f"read_{hours}h"] = series(srv.url(db), hours, args.n)
            progress(f"forecast.read {hours} h: {out[f'read_{hours}h']}")
        srv.drop_database(db)
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
