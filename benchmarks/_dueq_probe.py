"""Where the due query's time goes: ``python -m benchmarks._dueq_probe [--rows N] [--shared-buffers 1GB]``.

On one generated data set: the client-side series (SQLAlchemy, like the figure), the server-side
series (``EXPLAIN (ANALYZE, TIMING OFF, BUFFERS)``: execution time and buffers per execution),
the client-side cost of fetching the 200 rows, then the same after restarting the embedded server
with a larger ``shared_buffers`` (on the same data).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from datetime import UTC, datetime

import psycopg

from benchmarks._dueq import BATCH, _psycopg_query, percentile
from benchmarks._infra import progress
from benchmarks._seed import seed_history
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline.store import migrate, queries, repository
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.servers import Servers


def client_series(srv: Servers, db: str, n: int) -> dict:
    engine = make_engine(srv.url(db), pool_size=1)
    times = []
    with engine.connect() as conn:
        for i in range(n + 20):
            trans = conn.begin()
            t0 = time.perf_counter()
            conn.execute(
                queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED,
                {"as_of": datetime.now(UTC), "batch_size": BATCH, **repository.scan_params()},
            ).all()
            dt = (time.perf_counter() - t0) * 1000
            trans.rollback()
            if i >= 20:
                times.append(dt)
    engine.dispose()
    return {
        "p50": statistics.median(times),
        "p90": percentile(times, 90),
        "p99": percentile(times, 99),
        "max": max(times),
    }


def raw_series(srv: Servers, db: str, n: int, lock: bool = True) -> dict:
    """psycopg directly, no SQLAlchemy; optionally without FOR UPDATE (what the lock costs)."""
    sql = _psycopg_query()
    if not lock:
        sql = sql.replace("FOR UPDATE OF r SKIP LOCKED", "")
    times = []
    with psycopg.connect(srv.dsn(db)) as conn:
        for i in range(n + 20):
            with conn.transaction(force_rollback=True):
                t0 = time.perf_counter()
                conn.execute(
                    sql,
                    {"as_of": datetime.now(UTC), "batch_size": BATCH, **repository.scan_params()},
                ).fetchall()
                dt = (time.perf_counter() - t0) * 1000
            if i >= 20:
                times.append(dt)
    return {"p50": statistics.median(times), "p99": percentile(times, 99)}


def server_series(srv: Servers, db: str, n: int) -> dict:
    sql = "EXPLAIN (ANALYZE, TIMING OFF, BUFFERS, SUMMARY) " + _psycopg_query()
    exec_ms, plan_ms, bufs = [], [], {"hit": [], "read": [], "dirtied": [], "written": []}
    with psycopg.connect(srv.dsn(db)) as conn:
        for i in range(n + 20):
            with conn.transaction(force_rollback=True):
                lines = [
                    r[0]
                    for r in conn.execute(
                        sql,
                        {
                            "as_of": datetime.now(UTC),
                            "batch_size": BATCH,
                            **repository.scan_params(),
                        },
                        prepare=False,
                    )
                ]
            if i < 20:
                continue
            text = "\n".join(lines)
            exec_ms.append(float(re.search(r"Execution Time: ([\d.]+)", text).group(1)))
            plan_ms.append(float(re.search(r"Planning Time: ([\d.]+)", text).group(1)))
            top = next((ln for ln in lines if "Buffers:" in ln), "")
            for key, series in bufs.items():
                m = re.search(rf"{key}=(\d+)", top)
                series.append(int(m.group(1)) if m else 0)
    return {
        "exec_p50": statistics.median(exec_ms),
        "exec_p99": percentile(exec_ms, 99),
        "plan_p50": statistics.median(plan_ms),
        **{f"buf_{k}_avg": round(statistics.mean(v), 1) for k, v in bufs.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--due", type=int, default=5_000)
    p.add_argument("-n", type=int, default=300)
    p.add_argument("--shared-buffers", default="1GB")
    args = p.parse_args()
    import shutil
    import tempfile
    from pathlib import Path

    workdir = Path(tempfile.mkdtemp(prefix="rp-probe-"))
    pg = EmbeddedPostgres(data_dir=workdir / "data", port=free_port())
    pg.start()
    try:
        srv = Servers(pg.url("postgres"), "127.0.0.1:1", workdir, embedded=True)
        db = srv.create_database("probe")
        engine = make_engine(srv.url(db), pool_size=1)
        migrate.upgrade(engine)
        engine.dispose()
        gen = seed_history(srv.dsn(db), args.rows, args.due, datetime.now(UTC), progress)
        progress(f"generated in {gen['total_s']:.0f}s")
        for label in ("shared_buffers=128MB", f"shared_buffers={args.shared_buffers}"):
            if label != "shared_buffers=128MB":
                with (pg.data_dir / "postgresql.conf").open("a") as f:
                    f.write(f"\nshared_buffers = {args.shared_buffers}\n")
                pg.stop()
                pg.start()
                with psycopg.connect(srv.dsn(db), autocommit=True) as conn:  # warm like before
                    conn.execute("SELECT count(*) FROM event_reminders WHERE status = 'Pending'")
            for name, fn in (
                ("client (SQLAlchemy)", client_series),
                ("client (psycopg, FOR UPDATE)", raw_series),
                ("client (psycopg, no lock)", lambda s, d, n: raw_series(s, d, n, False)),
                ("server (EXPLAIN ANALYZE)", server_series),
            ):
                res = fn(srv, db, args.n)
                print(
                    f"{label:22} {name:30} "
                    + ", ".join(
                        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in res.items()
                    ),
                    flush=True,
                )
        srv.drop_database(db)
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
