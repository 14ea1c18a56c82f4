"""Figure 3: the due query at ``--rows`` rows (about 5k due), p50/p99 with its index, EXPLAIN, and
a sequential-scan baseline on the same data."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime

import psycopg
from psycopg import sql as psql

from benchmarks._infra import progress
from benchmarks._seed import _bind, seed_history
from reminder_pipeline.store import migrate, queries, repository
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.servers import Servers

INDEX_NAME = "ix_event_reminders_status_due_at"
BATCH = 200


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _psycopg_query() -> str:
    params = {"as_of": 1, "batch_size": 1, **repository.scan_params()}
    return _bind(str(queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED), params)[0]


def explain(conn: psycopg.Connection, as_of: datetime) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the due query in a transaction that rolls back."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + _psycopg_query(),
            {"as_of": as_of, "batch_size": BATCH, **repository.scan_params()},
            prepare=False,
        ).fetchall()
    return [r[0] for r in rows]


def generic_plan(conn: psycopg.Connection) -> list[str]:
    """The generic plan (what a prepared statement may switch to after 5 executions)."""
    sql = (
        str(queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED)
        .replace(":as_of", "$1")
        .replace(":batch_size", "$2")
        .replace(":from_due_at", "'-infinity'")
        .replace(":from_id", "'00000000-0000-0000-0000-000000000000'")
    )
    with conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (GENERIC_PLAN) " + sql, prepare=False).fetchall()
    return [r[0] for r in rows]


def plan_summary(lines: list[str]) -> list[str]:
    keep = []
    for line in lines:
        s = line.strip()
        if (
            s.startswith(
                (
                    "->",
                    "Limit",
                    "LockRows",
                    "Planning Time",
                    "Execution Time",
                    "Buffers",
                    "Index Cond",
                    "Filter",
                )
            )
            or "Scan" in s
        ):
            keep.append(line.rstrip())
    return keep[:18]


def _prepared_series(srv: Servers, db: str, executions: int) -> dict:
    """The same query as a server-side prepared statement (PREPARE survives the ROLLBACKs, unlike
    psycopg's automatic preparation, which a ROLLBACK clears): what a long-lived connection that
    commits runs after five executions, with PostgreSQL's plan cache (custom, then maybe generic)."""
    sql = (
        str(queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED)
        .replace(":as_of", "$1")
        .replace(":batch_size", "$2")
        .replace(":from_due_at", "'-infinity'")
        .replace(":from_id", "'00000000-0000-0000-0000-000000000000'")
    )
    times: list[float] = []
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        conn.execute("PREPARE bench_due(timestamptz, int) AS " + sql, prepare=False)
        for i in range(executions + 20):
            with conn.transaction(force_rollback=True):
                t0 = time.perf_counter()
                conn.execute(
                    psql.SQL("EXECUTE bench_due({}, {})").format(
                        psql.Literal(datetime.now(UTC)), psql.Literal(BATCH)
                    ),
                    prepare=False,
                ).fetchall()
                if i >= 20:
                    times.append((time.perf_counter() - t0) * 1000)
        generic, custom = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'bench_due'"
        ).fetchone()
    progress(
        f"due query (prepared): p50 {statistics.median(times):.1f} ms, "
        f"p99 {percentile(times, 99):.1f} ms, generic plans {generic}"
    )
    return {
        "p50_ms": statistics.median(times),
        "p99_ms": percentile(times, 99),
        "generic_plans": int(generic),
        "custom_plans": int(custom),
    }


def run(srv: Servers, rows: int, executions: int, due: int = 5000, seqscan_runs: int = 3) -> dict:
    db = srv.create_database("dueq")
    engine = make_engine(srv.url(db), pool_size=1)
    migrate.upgrade(engine)
    engine.dispose()
    base = datetime.now(UTC)
    progress(f"due query: generating {rows:,} reminders (about {due:,} due)")
    gen = seed_history(srv.dsn(db), rows, due, base, progress)
    progress(
        f"due query: data ready in {gen['total_s']:.0f}s (load {gen['load_s']:.0f}s, "
        f"indexes {gen['index_s']:.0f}s, vacuum/analyze {gen['vacuum_s']:.0f}s), "
        f"{gen['rows']:,} rows, {gen['due_pending']:,} due, {gen['size_mb']:,} MB"
    )
    out: dict = {"generation": gen}
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        out["index_exists"] = bool(
            conn.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", (INDEX_NAME,)).fetchone()
        )
        out["last_analyze"] = conn.execute(
            "SELECT greatest(last_analyze, last_autoanalyze) FROM pg_stat_user_tables "
            "WHERE relname = 'event_reminders'"
        ).fetchone()[0]
        out["due_at_measurement"] = int(
            conn.execute(
                "SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < now()"
            ).fetchone()[0]
        )
        lines = explain(conn, datetime.now(UTC))
        out["explain"] = lines
        out["explain_summary"] = plan_summary(lines)
        out["uses_index"] = any(INDEX_NAME in ln for ln in lines)
        try:  # EXPLAIN (GENERIC_PLAN) exists from PostgreSQL 16 on
            out["generic_plan"] = generic_plan(conn)
            out["generic_uses_index"] = any(INDEX_NAME in ln for ln in out["generic_plan"])
        except psycopg.Error:
            out["generic_plan"], out["generic_uses_index"] = [], None

    # The app's path: SQLAlchemy + psycopg 3 (server-side prepared after 5 executions), each
    # execution in its own transaction rolled back, so nothing changes between executions.
    engine = make_engine(srv.url(db), pool_size=1)
    statement = queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED
    times: list[float] = []
    counts: list[int] = []
    with engine.connect() as conn:
        for i in range(executions + 20):
            trans = conn.begin()
            t0 = time.perf_counter()
            fetched = conn.execute(
                statement,
                {"as_of": datetime.now(UTC), "batch_size": BATCH, **repository.scan_params()},
            ).all()
            elapsed = time.perf_counter() - t0
            trans.rollback()
            if i >= 20:  # warm-up
                times.append(elapsed * 1000)
                counts.append(len(fetched))
            if i >= 20 and (i - 19) % 100 == 0:
                progress(
                    f"due query: {i - 19}/{executions} executions, p50 "
                    f"{statistics.median(times):.1f} ms, p99 {percentile(times, 99):.1f} ms"
                )
    engine.dispose()
    out.update(
        executions=len(times),
        rows_returned=min(counts) if counts else 0,
        p50_ms=statistics.median(times),
        p90_ms=percentile(times, 90),
        p99_ms=percentile(times, 99),
        max_ms=max(times),
    )
    out["prepared"] = _prepared_series(srv, db, executions)
    # Baseline: the same query with index scans disabled (a sequential scan), a few executions.
    seq: list[float] = []
    with psycopg.connect(srv.dsn(db)) as conn:
        for _ in range(seqscan_runs):
            with conn.transaction(force_rollback=True):
                conn.execute("SET LOCAL enable_indexscan = off")
                conn.execute("SET LOCAL enable_bitmapscan = off")
                conn.execute("SET LOCAL enable_indexonlyscan = off")
                t0 = time.perf_counter()
                conn.execute(
                    _psycopg_query(),
                    {"as_of": datetime.now(UTC), "batch_size": BATCH, **repository.scan_params()},
                    prepare=False,
                ).fetchall()
                seq.append((time.perf_counter() - t0) * 1000)
            progress(f"due query: sequential-scan baseline {seq[-1]:.0f} ms")
    out["seqscan_ms"] = statistics.median(seq) if seq else None
    progress(
        f"due query: p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms "
        f"(index used: {out['uses_index']}), seq scan {out['seqscan_ms']:.0f} ms"
    )
    srv.drop_database(db)
    return out
