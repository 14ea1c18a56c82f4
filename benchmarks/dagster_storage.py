"""Dagster's storage after a month of minute runs, before and after retention, and the Runs page.

    python -m benchmarks.dagster_storage [--days 30] [--keep-days 14] [--loads 5] [--json FILE]
                                         [--keep-workdir]

What it does, on its own embedded PostgreSQL + broker (or DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS):

1. starts the real Dagster stack (webserver + daemon, PostgreSQL storage as in production) on a
   fresh DAGSTER_HOME and lets the schedule make one real ``reminder_dispatch`` run that sends a
   few demo reminders: its run row, tags, event log and files are the template;
2. with the stack stopped, clones that run ``days * 1440 - 1`` times, one a minute back in time,
   with SQL in Dagster's database (runs, run_tags, event_logs, asset_event_tags; run ids replaced
   in the serialized bodies) and a copy of its directory under ``DAGSTER_HOME/storage`` each,
   then VACUUM ANALYZE (as autovacuum would have over the month);
3. measures the database (``pg_database_size``, the biggest tables) and DAGSTER_HOME (apparent
   bytes, bytes on disk, files), then, with the stack started again, the Runs page
   (``/runs``) in headless Chromium: time from navigation to the first run row, a cold first load
   and the median of warm reloads;
4. launches ``dagster_run_retention`` (``keep_days``) from GraphQL as an operator would and reads
   its counts (again while it reports runs left for next time: the budget);
5. measures everything again: as left by retention, after a plain VACUUM (space reusable, files
   not shrunk) and after VACUUM FULL (what the kept data occupies), and the Runs page once more.

The cloned event-log rows keep the template's JSON timestamps (their ``timestamp`` column is
shifted); only sizes and run lists are read from them. Progress goes to stderr, the figures to
stdout. ``--budget-seconds`` gives the retention runs a smaller budget, so the passes show a
run stopping on its budget and the next resuming where it stopped. Not a test: ~15 minutes at
30 days on 2 CPUs, ~4 GB of disk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from benchmarks._infra import progress, server_version, servers
from reminder_pipeline_testkit.servers import Servers

MINUTES_PER_DAY = 1440
DISPATCH_JOB = "reminder_dispatch"
RETENTION_JOB = "dagster_run_retention"
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
TABLES = ("event_logs", "runs", "run_tags", "asset_event_tags", "snapshots", "job_ticks")


@dataclass
class Sizes:
    """Dagster's database and DAGSTER_HOME at one moment."""

    label: str
    runs: int
    event_log_rows: int
    database_bytes: int
    tables: dict[str, int]
    home_bytes: int
    home_disk_bytes: int
    home_files: int


@dataclass
class PageLoads:
    """The Runs page in headless Chromium: navigation → first run row visible, in seconds."""

    label: str
    cold_s: float | None = None
    warm_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def warm_median_s(self) -> float | None:
        return statistics.median(self.warm_s) if self.warm_s else None


@dataclass
class RetentionPass:
    """One dagster_run_retention run, as its output metadata and the run record say."""

    run_id: str
    status: str
    metadata: dict
    run_seconds: float


@dataclass
class Result:
    days: int
    keep_days: int
    budget_seconds: float | None = None
    template: dict = field(default_factory=dict)
    clone_seconds: float = 0.0
    sizes: list[Sizes] = field(default_factory=list)
    pages: list[PageLoads] = field(default_factory=list)
    passes: list[RetentionPass] = field(default_factory=list)
    notes: dict = field(default_factory=dict)


# --- DAGSTER_HOME and the database ------------------------------------------------------------


def home_size(home: Path) -> tuple[int, int, int]:
    """(apparent bytes, bytes on disk, files) under ``home``."""
    apparent = disk = files = 0
    for root, _dirs, names in os.walk(home):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            disk += st.st_blocks * 512
            files += 1
    return apparent, disk, files


def measure(srv: Servers, db: str, home: Path, label: str) -> Sizes:
    """Sizes of Dagster's database (whole, and its biggest tables) and of DAGSTER_HOME."""
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        database = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        tables = {
            name: conn.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()[0]
            for name in TABLES
        }
        runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        events = conn.execute("SELECT count(*) FROM event_logs").fetchone()[0]
    apparent, disk, files = home_size(home)
    sizes = Sizes(label, runs, events, database, tables, apparent, disk, files)
    progress(
        f"{label}: {runs:,} runs, {events:,} event-log rows, database {mb(database)}, "
        f"DAGSTER_HOME {mb(apparent)} ({mb(disk)} on disk, {files:,} files)"
    )
    return sizes


def runless_rows(srv: Servers, db: str) -> dict[str, int]:
    """Rows no run owns (so run retention never deletes them): the health sensor's check results."""
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        events = conn.execute("SELECT count(*) FROM event_logs WHERE run_id = ''").fetchone()[0]
        checks = conn.execute("SELECT count(*) FROM asset_check_executions").fetchone()[0]
        ticks = conn.execute("SELECT count(*) FROM job_ticks").fetchone()[0]
    return {"runless_event_log_rows": events, "asset_check_executions": checks, "ticks": ticks}


def vacuum(srv: Servers, db: str, full: bool = False) -> float:
    started = time.monotonic()
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:
        conn.execute("VACUUM (FULL, ANALYZE)" if full else "VACUUM (ANALYZE)")
    return time.monotonic() - started


def mb(value: float) -> str:
    return f"{value / 2**20:,.0f} MB" if value >= 2**20 else f"{value / 2**10:,.0f} kB"


# --- the template run and its clones ----------------------------------------------------------


def template_profile(srv: Servers, db: str, home: Path, run_id: str) -> dict:
    """What one real minute run leaves: rows and bytes per table, files under storage/."""
    with psycopg.connect(srv.dsn(db), autocommit=True) as conn:

        def one(query: str) -> tuple:
            return conn.execute(query, {"run": run_id}).fetchone()

        events, event_bytes = one(
            "SELECT count(*), coalesce(sum(pg_column_size(e.*)), 0) "
            "FROM event_logs e WHERE run_id = %(run)s"
        )
        tags = one("SELECT count(*) FROM run_tags WHERE run_id = %(run)s")[0]
        run_bytes = one("SELECT pg_column_size(r.*) FROM runs r WHERE run_id = %(run)s")[0]
        asset_tags = one(
            "SELECT count(*) FROM asset_event_tags t JOIN event_logs e "
            "ON e.id = t.event_id WHERE e.run_id = %(run)s"
        )[0]
        types = dict(
            conn.execute(
                "SELECT dagster_event_type, count(*) FROM event_logs WHERE run_id = %(run)s "
                "GROUP BY 1 ORDER BY 2 DESC",
                {"run": run_id},
            ).fetchall()
        )
        timezone = conn.execute("SHOW TimeZone").fetchone()[0]
    run_dir = home / "storage" / run_id
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    apparent, disk, _ = home_size(run_dir)
    return {
        "run_id": run_id,
        "event_log_rows": events,
        "event_log_row_bytes": event_bytes,
        "other_storage": other_storage(home),
        "run_row_bytes": run_bytes,
        "run_tags": tags,
        "asset_event_tags": asset_tags,
        "event_types": {str(k): v for k, v in types.items()},
        "files": files,
        "file_bytes": apparent,
        "file_disk_bytes": disk,
        "server_timezone": timezone,
    }


_RUN_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def other_storage(home: Path) -> dict[str, int]:
    """Files under storage/ outside run directories, per top-level directory (tick logs, ...)."""
    others: dict[str, int] = {}
    for entry in sorted((home / "storage").iterdir()):
        if entry.is_dir() and not _RUN_ID.match(entry.name):
            others[entry.name] = sum(1 for p in entry.rglob("*") if p.is_file())
    return others


# One statement per table per chunk of clones; clone i is the template moved i minutes back.
# Run ids are replaced in the serialized run body and events, so every clone reads as its own run.
CREATE_CLONE_IDS = """
CREATE TEMP TABLE clone_ids AS
SELECT i, gen_random_uuid()::text AS rid FROM generate_series(1, %(count)s) AS i
"""
CLONE_RUNS = """
INSERT INTO runs (run_id, snapshot_id, pipeline_name, mode, status, run_body, partition,
                  partition_set, create_timestamp, update_timestamp, start_time, end_time,
                  backfill_id)
SELECT c.rid, r.snapshot_id, r.pipeline_name, r.mode, r.status,
       replace(r.run_body, r.run_id, c.rid), r.partition, r.partition_set,
       r.create_timestamp - make_interval(mins => c.i),
       r.update_timestamp - make_interval(mins => c.i), r.start_time - c.i * 60.0,
       r.end_time - c.i * 60.0, r.backfill_id
  FROM runs r CROSS JOIN clone_ids c
 WHERE r.run_id = %(run)s AND c.i BETWEEN %(lo)s AND %(hi)s
 ORDER BY c.i DESC
"""
CLONE_TAGS = """
INSERT INTO run_tags (run_id, key, value)
SELECT c.rid, t.key, t.value
  FROM run_tags t CROSS JOIN clone_ids c
 WHERE t.run_id = %(run)s AND c.i BETWEEN %(lo)s AND %(hi)s
"""
# New event ids are drawn first, so the asset event tags can point at their clone's event.
CLONE_EVENTS = """
WITH src AS MATERIALIZED (
    SELECT e.id AS old_id, nextval(pg_get_serial_sequence('event_logs', 'id')) AS new_id,
           c.rid, c.i, e.event, e.dagster_event_type, e.timestamp, e.step_key, e.asset_key,
           e.partition
      FROM event_logs e CROSS JOIN clone_ids c
     WHERE e.run_id = %(run)s AND c.i BETWEEN %(lo)s AND %(hi)s
     ORDER BY c.i DESC, e.id
), events AS (
    INSERT INTO event_logs (id, run_id, event, dagster_event_type, timestamp, step_key, asset_key,
                            partition)
    SELECT new_id, rid, replace(event, %(run)s, rid), dagster_event_type,
           timestamp - make_interval(mins => i), step_key, asset_key, partition
      FROM src
)
INSERT INTO asset_event_tags (event_id, asset_key, key, value, event_timestamp)
SELECT s.new_id, t.asset_key, t.key, t.value, t.event_timestamp - make_interval(mins => s.i)
  FROM src s JOIN asset_event_tags t ON t.event_id = s.old_id
"""


def clone_runs(srv: Servers, db: str, home: Path, run_id: str, count: int) -> float:
    """``count`` copies of the run, one a minute back each: rows by SQL, files by copy."""
    started = time.monotonic()
    template_dir = home / "storage" / run_id
    files = [
        (p.relative_to(template_dir), p.read_bytes())
        for p in sorted(template_dir.rglob("*"))
        if p.is_file()
    ]
    chunk = MINUTES_PER_DAY
    with psycopg.connect(srv.dsn(db)) as conn:
        conn.execute(CREATE_CLONE_IDS, {"count": count})
        rids = [row[0] for row in conn.execute("SELECT rid FROM clone_ids ORDER BY i")]
        conn.commit()
        done = 0
        # Oldest day first, so ids grow with creation time as they do in production.
        for hi in range(count, 0, -chunk):
            lo = max(1, hi - chunk + 1)
            params = {"run": run_id, "lo": lo, "hi": hi}
            for statement in (CLONE_RUNS, CLONE_TAGS, CLONE_EVENTS):
                conn.execute(statement, params)
            conn.commit()
            for rid in rids[lo - 1 : hi]:
                for relative, content in files:
                    target = home / "storage" / rid / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
            done += hi - lo + 1
            rate = done / (time.monotonic() - started)
            progress(f"cloned {done:,}/{count:,} runs ({rate:,.0f} runs/s, rows and files)")
    return time.monotonic() - started


# --- the Runs page ----------------------------------------------------------------------------


def runs_page_loads(base_url: str, label: str, loads: int, artifacts: Path | None) -> PageLoads:
    """Navigation to the first run row of ``/runs``: one cold load, then ``loads`` warm ones."""
    from reminder_pipeline_testkit.browser import CHROMIUM_FLAGS, chromium_path

    result = PageLoads(label)
    if chromium_path() is None:
        result.error = "chromium not installed (Debian: apt-get install chromium)"
        return result
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        result.error = f"playwright not installed: {exc}"
        return result
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(180_000)
            # A run row links to its run page (/runs/<uuid>) with the id's first 8 characters.
            first_row = (
                page.locator("a[href^='/runs/']")
                .filter(has_text=re.compile(r"^[0-9a-f]{8}$"))
                .first
            )
            for attempt in range(loads + 1):
                started = time.perf_counter()
                page.goto(f"{base_url}/runs", wait_until="commit")
                first_row.wait_for(state="visible")
                elapsed = time.perf_counter() - started
                if attempt == 0:
                    result.cold_s = elapsed
                    if artifacts is not None:
                        page.screenshot(path=str(artifacts / f"runs-page-{label}.png"))
                else:
                    result.warm_s.append(elapsed)
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            result.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finally:
            browser.close()
    progress(
        f"Runs page {label}: cold {fmt_s(result.cold_s)}, warm median "
        f"{fmt_s(result.warm_median_s)} {result.error or ''}"
    )
    return result


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# --- the real stack ---------------------------------------------------------------------------


def wait_for_run(instance, job_name: str, timeout: float, since_id: str | None = None) -> str:
    """The id of the first finished run of ``job_name`` (other than ``since_id``)."""
    from dagster import DagsterRunStatus, RunsFilter

    deadline = time.monotonic() + timeout
    statuses = [DagsterRunStatus(s) for s in FINISHED]
    while True:
        records = instance.get_run_records(
            filters=RunsFilter(job_name=job_name, statuses=statuses), limit=5, ascending=True
        )
        for record in records:
            if record.dagster_run.run_id != since_id:
                return record.dagster_run.run_id
        if time.monotonic() > deadline:
            raise RuntimeError(f"no finished {job_name} run within {timeout:.0f} s")
        time.sleep(1.0)


def retention_pass(stack, instance, keep_days: int, budget_seconds: float | None) -> RetentionPass:
    """Launch dagster_run_retention from GraphQL, wait for it, read its output metadata."""
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient(stack.host, port_number=stack.port)
    started = time.monotonic()
    config: dict[str, object] = {"keep_days": keep_days}
    if budget_seconds is not None:
        config["budget_seconds"] = budget_seconds
    run_id = client.submit_job_execution(RETENTION_JOB, run_config=config)
    progress(f"{RETENTION_JOB} run {run_id} launched ({config})")
    while True:
        record = instance.get_run_record_by_id(run_id)
        if record is not None and record.dagster_run.status.value in FINISHED:
            break
        time.sleep(2.0)
    elapsed = time.monotonic() - started
    outputs = [
        e
        for e in instance.all_logs(run_id)
        if e.is_dagster_event and e.dagster_event.is_successful_output
    ]
    metadata = (
        {k: v.value for k, v in outputs[0].dagster_event.event_specific_data.metadata.items()}
        if outputs
        else {}
    )
    status = record.dagster_run.status.value
    progress(f"{RETENTION_JOB} {status} in {elapsed:.0f} s: {metadata}")
    return RetentionPass(run_id, status, metadata, elapsed)


def run(
    srv: Servers,
    *,
    days: int,
    keep_days: int,
    loads: int,
    artifacts: Path | None,
    budget_seconds: float | None = None,
    max_passes: int = 12,
) -> Result:
    from dagster import DagsterInstance

    from reminder_pipeline.local import demo
    from reminder_pipeline.local.dagster_processes import (
        DagsterStack,
        dagster_storage_url,
        prepare_home,
    )
    from reminder_pipeline.local.servers import free_port
    from reminder_pipeline.messaging.kafka import ensure_topic
    from reminder_pipeline.store import migrate
    from reminder_pipeline.store.engine import make_engine

    result = Result(days=days, keep_days=keep_days, budget_seconds=budget_seconds)
    ensure_topic(srv.kafka)
    app_db = srv.create_database("app")
    dag_db = srv.create_database("dagster")
    engine = make_engine(srv.url(app_db), pool_size=1)
    migrate.upgrade(engine)
    demo.seed(engine, overdue=5, upcoming=0, seed_value=7)  # the template run sends a few
    engine.dispose()
    home = srv.workdir / "dagster_home"
    dagster_url = dagster_storage_url(srv.url(dag_db))
    env = {
        "DATABASE_URL": srv.url(app_db),
        "KAFKA_BOOTSTRAP_SERVERS": srv.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_url,
    }
    os.environ["DAGSTER_PG_URL"] = dagster_url
    os.environ["DAGSTER_HOME"] = str(home)
    prepare_home(home)
    instance = DagsterInstance.from_config(str(home))
    stack = DagsterStack(home, env, port=free_port())
    try:
        progress(f"starting webserver + daemon on {stack.url}; waiting for a scheduled run")
        stack.start(timeout=300)
        template = wait_for_run(instance, DISPATCH_JOB, timeout=240)
        stack.stop()
        result.template = template_profile(srv, dag_db, home, template)
        progress(
            f"template run {template}: {result.template['event_log_rows']} event-log rows, "
            f"{len(result.template['files'])} files"
        )
        result.sizes.append(measure(srv, dag_db, home, "one real run"))

        total = days * MINUTES_PER_DAY
        result.clone_seconds = clone_runs(srv, dag_db, home, template, total - 1)
        result.notes["vacuum_analyze_s"] = vacuum(srv, dag_db)
        result.sizes.append(measure(srv, dag_db, home, f"{days} days of minute runs"))

        stack.start(timeout=300)
        stack_started = time.monotonic()
        result.pages.append(runs_page_loads(stack.url, f"{days}-days", loads, artifacts))
        for _ in range(max_passes):
            result.passes.append(retention_pass(stack, instance, keep_days, budget_seconds))
            if not result.passes[-1].metadata.get("left_for_next_time"):
                break
        result.sizes.append(measure(srv, dag_db, home, "after retention"))
        result.notes["other_storage_after"] = other_storage(home)
        result.notes["stack_minutes"] = round((time.monotonic() - stack_started) / 60, 1)
        result.notes["runless"] = runless_rows(srv, dag_db)
        result.pages.append(runs_page_loads(stack.url, "after-retention", loads, artifacts))
        stack.stop()
        result.notes["vacuum_after_s"] = vacuum(srv, dag_db)
        result.sizes.append(measure(srv, dag_db, home, "after retention + VACUUM"))
        result.notes["vacuum_full_s"] = vacuum(srv, dag_db, full=True)
        result.sizes.append(measure(srv, dag_db, home, "after retention + VACUUM FULL"))
    finally:
        stack.stop()
        instance.dispose()
    return result


# --- report -----------------------------------------------------------------------------------


def report(result: Result) -> str:
    """The figures as Markdown tables (sizes, Runs page, retention passes, a year's projection)."""
    lines = [
        (
            f"## Dagster storage: {result.days} days of minute runs, keep_days={result.keep_days}, "
            f"budget_seconds={result.budget_seconds or 'default'}"
        ),
        "",
    ]
    t = result.template
    if t:
        lines += [
            (
                f"One real `{DISPATCH_JOB}` run: {t['event_log_rows']} event-log rows "
                f"({mb(t['event_log_row_bytes'])}), run row {mb(t['run_row_bytes'])}, "
                f"{t['run_tags']} tags, {len(t['files'])} files ({mb(t['file_bytes'])}, "
                f"{mb(t['file_disk_bytes'])} on disk); cloned in {result.clone_seconds:.0f} s."
            ),
            (
                f"Files under storage/ besides run directories: {t.get('other_storage') or 'none'} "
                f"after the first run; {result.notes.get('other_storage_after') or 'none'} after "
                f"the stack ran {result.notes.get('stack_minutes', '?')} more minutes, when "
                f"Dagster's database also held {result.notes.get('runless', {})} (owned by no run)."
            ),
            "",
        ]
    lines += [
        (
            "| moment | runs | event-log rows | database | event_logs | runs table | "
            "DAGSTER_HOME (on disk) | files |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result.sizes:
        lines.append(
            f"| {s.label} | {s.runs:,} | {s.event_log_rows:,} | {mb(s.database_bytes)} | "
            f"{mb(s.tables['event_logs'])} | {mb(s.tables['runs'])} | "
            f"{mb(s.home_bytes)} ({mb(s.home_disk_bytes)}) | {s.home_files:,} |"
        )
    lines += [
        "",
        "| Runs page (`/runs`, first run row visible) | cold load | warm median | warm loads |",
        "|---|---|---|---|",
    ]
    for p in result.pages:
        warm = ", ".join(f"{x:.2f}" for x in p.warm_s) or p.error
        lines.append(f"| {p.label} | {fmt_s(p.cold_s)} | {fmt_s(p.warm_median_s)} | {warm} |")
    lines += [
        "",
        (
            "| retention pass | status | runs deleted | dirs | removed | left | budget spent | "
            "op seconds | runs/s | launch to end |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(result.passes, 1):
        m = p.metadata
        seconds = m.get("duration_seconds") or 0
        rate = m.get("runs_deleted", 0) / seconds if seconds else 0
        lines.append(
            f"| {i} | {p.status} | {m.get('runs_deleted', 0):,} | "
            f"{m.get('directories_removed', 0):,} | {mb(m.get('bytes_removed', 0))} | "
            f"{m.get('left_for_next_time', 0):,} | {m.get('budget_exhausted')} | "
            f"{seconds:.0f} | {rate:,.0f} | "
            f"{p.run_seconds:.0f} s |"
        )
    lines += ["", projection(result)]
    return "\n".join(lines)


def projection(result: Result) -> str:
    """A year at the measured per-run sizes and deletion rate."""
    from reminder_pipeline.defs.run_retention import RUN_RETENTION_MAX_RUNTIME_SECONDS
    from reminder_pipeline.defs.run_retention_pass import RUN_RETENTION_BUDGET_SECONDS

    deleted = sum(p.metadata.get("runs_deleted", 0) for p in result.passes)
    seconds = sum(p.metadata.get("duration_seconds", 0) for p in result.passes)
    if not deleted or not seconds or len(result.sizes) < 2:
        return "No deletion measured."
    rate = deleted / seconds
    month = result.sizes[1]
    per_run_db = month.database_bytes / month.runs
    per_run_home = month.home_disk_bytes / month.runs
    year = 365 * MINUTES_PER_DAY
    backlog = year - result.keep_days * MINUTES_PER_DAY
    per_pass = rate * RUN_RETENTION_BUDGET_SECONDS
    # Each day's pass also has the day's new runs to delete once the backlog is past keep_days.
    clearing_days = backlog / max(per_pass - MINUTES_PER_DAY, 1.0)
    return (
        f"Deletion rate {rate:,.0f} runs/s. Per run: {per_run_db / 1024:,.1f} kB of database, "
        f"{per_run_home / 1024:,.1f} kB of DAGSTER_HOME on disk. A year without retention: "
        f"~{per_run_db * year / 2**30:,.1f} GB of database, ~{per_run_home * year / 2**30:,.1f} GB "
        f"of DAGSTER_HOME. The first pass over a year ({backlog:,} runs to delete) stops at its "
        f"{RUN_RETENTION_BUDGET_SECONDS:.0f} s budget "
        f"(max_runtime {RUN_RETENTION_MAX_RUNTIME_SECONDS} s) after ~{per_pass:,.0f} runs; "
        f"daily passes clear it in ~{clearing_days:,.1f} days (each day adds {MINUTES_PER_DAY:,})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30, help="days of minute runs (default 30)")
    parser.add_argument("--keep-days", type=int, default=14, help="retention (default 14)")
    parser.add_argument("--loads", type=int, default=5, help="warm Runs page loads (default 5)")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        help="the retention runs' budget_seconds (default: the job's); a small one "
        "shows passes stopping on their budget and the next resuming",
    )
    parser.add_argument("--json", type=Path, help="write every measurement to this file")
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=Path("test-artifacts"),
        help="Runs page screenshots (default test-artifacts/)",
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    if args.days * MINUTES_PER_DAY < 2 or not 1 <= args.keep_days < args.days:
        parser.error("need --days >= 1 and 1 <= --keep-days < --days")
    args.artifacts.mkdir(parents=True, exist_ok=True)
    with servers(keep_workdir=args.keep_workdir) as srv:
        progress(f"PostgreSQL {server_version(srv)}")
        result = run(
            srv,
            days=args.days,
            keep_days=args.keep_days,
            loads=args.loads,
            artifacts=args.artifacts,
            budget_seconds=args.budget_seconds,
        )
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
