"""One stack of ``benchmarks.shared_db``: its own embedded PostgreSQL 18 (with
``pg_stat_statements``) and broker, the application's database at this code's head, the feeder,
``reminder-pipeline dispatch`` as a command, and what is measured around each dispatch.

What the dispatcher does is measured without touching its code: ``pg_stat_statements`` (the
dispatcher's own role: the feeder and the harness connect as another, ``HARNESS_ROLE``, so their
statements are left out) gives each statement's calls, time and buffers, the due statement found
by its text (``queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED``, compared word for word with its
literals and parameters left out, whatever they are); ``pg_stat_user_indexes`` the entries read
from the due index; the cycle's JSON output (``dispatch --json``) its duration, counts, AsOf and
lateness; then the rows still Pending and due at that AsOf, the dead tuples, the index sizes and
who holds back the xmin horizon (``metrics_repository.snapshot_holders``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from difflib import SequenceMatcher
from pathlib import Path

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine, make_url

from reminder_pipeline.store import metrics_repository, queries
from reminder_pipeline_testkit.feeder import feed
from reminder_pipeline_testkit.held_snapshot import HeldSnapshot
from reminder_pipeline_testkit.servers import Servers

#: The partial index the due statement walks, and the relay's unpublished index.
DUE_INDEX = "ix_event_reminders_status_due_at"
OUTBOX_INDEX = "ix_outbox_unpublished"
#: The role the feeder and the measurements connect as (the dispatcher is the server's own).
HARNESS_ROLE = "rpb_harness"
FEEDER_NAME = "rpb-feeder"
#: Settings of each stack's PostgreSQL beyond the embedded defaults: statement statistics and
#: autovacuum's log lines ("dead but not yet removable") in the server log (``--keep-workdir``).
PG_SETTINGS = ("log_autovacuum_min_duration = 0",)
#: A dispatch that has not ended by then is killed (its budget is 30 s).
DISPATCH_TIMEOUT_S = 300.0

#: What ``pg_stat_statements`` turns into ``$n`` (literals, numbers, booleans) and what the
#: statement's own parameters look like (``:name``, ``%(name)s``, ``$n``).
_LITERALS = re.compile(
    r"'(?:[^']|'')*'|\$\d+|(?<![:\w]):\w+|%\(\w+\)s|\b\d+(?:\.\d+)?\b|\b(?:true|false)\b"
)
_WORDS = re.compile(r"[a-z_][a-z0-9_]*")


def statement_shape(sql: str) -> tuple[str, ...]:
    """The words of a statement without its literals and parameters: the same for its text in
    ``queries`` (``:name``) and as ``pg_stat_statements`` normalises it (``$1``)."""
    return tuple(_WORDS.findall(_LITERALS.sub(" ", sql.lower())))


DUE_SHAPE = statement_shape(str(queries.SELECT_DUE_FOR_UPDATE_SKIP_LOCKED))


def find_due_statement(texts: dict[int, str]) -> int | None:
    """The queryid whose text is the due statement's (the same words; else the closest above 0.9,
    so a changed constant or comment does not lose it)."""
    best, best_ratio = None, 0.9
    for queryid, sql in texts.items():
        shape = statement_shape(sql)
        if shape == DUE_SHAPE:
            return queryid
        ratio = SequenceMatcher(None, shape, DUE_SHAPE, autojunk=False).ratio()
        if ratio > best_ratio:
            best, best_ratio = queryid, ratio
    return best


# --- what is read around a dispatch -----------------------------------------------------------

STATEMENTS = text(
    """
    SELECT queryid, query, calls, total_exec_time, shared_blks_hit + shared_blks_read
      FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND userid = CAST(:role AS regrole) AND toplevel
    """
)
INDEX_READS = text(
    "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes "
    "WHERE indexrelname = ANY(:names)"
)
SESSIONS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND usename = :role AND pid <> pg_backend_pid()"
)
LEFT_DUE = text("SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < :as_of")
DEAD_AND_SIZES = text(
    """
    SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'event_reminders'),
           (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'),
           (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'event_reminders'),
           (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'outbox'),
           pg_relation_size(CAST(:due_index AS regclass)),
           pg_relation_size(CAST(:outbox_index AS regclass))
    """
)

#: Every index of the two queue tables with its size (issue 41's "the due index and the outbox
#: indexes stay bounded": reported at the start and the end of a run).
INDEX_SIZES = text(
    """
    SELECT c.relname, i.relname, pg_relation_size(i.oid)
      FROM pg_index x
      JOIN pg_class i ON i.oid = x.indexrelid
      JOIN pg_class c ON c.oid = x.indrelid
     WHERE c.relname IN ('event_reminders', 'outbox')
     ORDER BY c.relname, i.relname
    """
)


@dataclass
class Counters:
    """Cumulative statistics at one moment: per statement (calls, ms, buffers), per index."""

    statements: dict[int, tuple[int, float, int]]
    texts: dict[int, str]
    index_reads: dict[str, int]

    @classmethod
    def read(cls, conn: Connection, role: str) -> Counters:
        rows = conn.execute(STATEMENTS, {"role": role}).all()
        idx = conn.execute(INDEX_READS, {"names": [DUE_INDEX, OUTBOX_INDEX]}).all()
        return cls(
            {int(r[0]): (int(r[2]), float(r[3]), int(r[4])) for r in rows},
            {int(r[0]): str(r[1]) for r in rows},
            {str(r[0]): int(r[2]) for r in idx},
        )


@dataclass
class Sample:
    """One dispatch of one stack and the database right after it."""

    minute: int
    rate: float  # reminders a second fed in the minute this dispatch took
    started_s: float  # seconds after the feed's first due second
    exit_code: int
    command_s: float  # the command's wall time (Python's start, the cycle, the exit)
    dispatch_s: float | None  # the cycle's own duration (its duration_ms)
    sent: int = 0
    skipped: int = 0
    batches: int = 0
    max_lateness_s: float | None = None
    backlog_at_end: int | None = None  # due Pending at the end of the cycle (its own count)
    oldest_due_s: float | None = None  # how long the oldest of those had been due
    left_due: int | None = None  # Pending and due before the cycle's AsOf, right after it
    due_calls: int = 0  # executions of the due statement
    due_ms: float | None = None  # its mean server time
    due_buffers: float | None = None  # shared buffers hit + read per execution
    due_index_reads: float | None = None  # due-index entries read per execution (all readers)
    server_s: float = 0.0  # server time of every statement of the dispatcher's role
    dead_reminders: int = 0
    dead_outbox: int = 0
    autovacuums: int = 0  # autovacuum runs of the two tables so far
    due_index_mb: float = 0.0
    outbox_index_mb: float = 0.0
    holder: str | None = None  # application_name of the oldest xmin holder (none: nobody)
    holder_age_s: float | None = None
    holder_xmin_age: int | None = None
    error: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Stack:
    """One side of the comparison: ``A`` as the dispatcher has its database to itself, ``B``
    with a snapshot held (``snapshot``) for the whole run."""

    name: str
    srv: Servers
    app_db: str
    engine: Engine
    harness_dsn: str
    env: dict[str, str]
    log: Path
    snapshot: HeldSnapshot | None = None
    due_queryid: int | None = None
    samples: list[Sample] = field(default_factory=list)
    feed_lines: list[str] = field(default_factory=list)

    @property
    def dispatcher_role(self) -> str:
        return str(make_url(self.srv.admin_url).username)

    def index_sizes(self) -> dict[str, int]:
        """Each index of ``event_reminders`` and ``outbox``, ``table.index`` -> bytes."""
        with self.engine.connect() as conn:
            rows = conn.execute(INDEX_SIZES).all()
        return {f"{r[0]}.{r[1]}": int(r[2]) for r in rows}

    # --- the feeder ---------------------------------------------------------------------------

    def feed(self, due: datetime, n: int, spread_s: int) -> float:
        """``n`` reminders due on the seconds of ``spread_s`` from ``due`` (events with the
        contract's fields, one reminder each, as the calendar materialises them); returns the
        seconds the insert took."""
        started = time.perf_counter()
        if n > 0:
            feed(self.harness_dsn, due, n, disturb=False, spread_s=spread_s)
        return time.perf_counter() - started

    # --- one dispatch, measured ---------------------------------------------------------------

    def dispatch(self, minute: int, rate: float, t0: float) -> Sample:
        """``reminder-pipeline dispatch --json``, the statistics before and after it."""
        with self.engine.connect() as conn:
            before = Counters.read(conn, self.dispatcher_role)
        started = time.time()
        exe = Path(sys.executable).with_name("reminder-pipeline")
        with self.log.open("a") as log:
            log.write(f"--- minute {minute} ---\n")
            log.flush()
            try:
                proc = subprocess.run(
                    [str(exe), "dispatch", "--json"],
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=DISPATCH_TIMEOUT_S,
                    check=False,
                )
                code, out = proc.returncode, proc.stdout
            except subprocess.TimeoutExpired:
                code, out = -9, ""
        sample = Sample(minute, rate, round(started - t0, 1), code, time.time() - started, None)
        self._wait_sessions_gone()
        report = _last_json(out)
        if report is None:
            sample.error = f"dispatch exited {code} without its JSON (see {self.log})"
        else:
            sample.dispatch_s = int(report.get("duration_ms") or 0) / 1000
            sample.sent = int(report.get("sent") or 0)
            sample.skipped = int(report.get("skipped") or 0)
            sample.batches = int(report.get("batches") or 0)
            late = report.get("max_lateness_seconds")
            sample.max_lateness_s = None if late is None else float(late)
            sample.backlog_at_end = report.get("backlog_remaining")
            oldest = report.get("oldest_due_age_seconds")
            sample.oldest_due_s = None if oldest is None else round(float(oldest), 1)
        with self.engine.connect() as conn:
            after = Counters.read(conn, self.dispatcher_role)
            self._statements(sample, before, after)
            if report is not None and report.get("as_of"):
                as_of = datetime.fromisoformat(str(report["as_of"]))
                sample.left_due = int(conn.execute(LEFT_DUE, {"as_of": as_of}).scalar_one())
            self._database(sample, conn)
        self.samples.append(sample)
        return sample

    def _wait_sessions_gone(self, timeout: float = 5.0) -> None:
        """Until the command's sessions have ended: a backend reports its index reads to
        ``pg_stat_user_indexes`` as it exits, after its client has gone."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.engine.connect() as conn:
                if not conn.execute(SESSIONS, {"role": self.dispatcher_role}).scalar_one():
                    break
            time.sleep(0.05)
        time.sleep(0.1)

    def _statements(self, sample: Sample, before: Counters, after: Counters) -> None:
        deltas = {}
        for q, (calls, ms, blks) in after.statements.items():
            calls0, ms0, blks0 = before.statements.get(q, (0, 0.0, 0))
            deltas[q] = (calls - calls0, ms - ms0, blks - blks0)
        sample.server_s = round(sum(ms for _, ms, _ in deltas.values()) / 1000, 3)
        if self.due_queryid is None:
            self.due_queryid = find_due_statement(after.texts)
        due = deltas.get(self.due_queryid) if self.due_queryid is not None else None
        if due and due[0] > 0:
            calls, ms, blks = due
            sample.due_calls = calls
            sample.due_ms = round(ms / calls, 3)
            sample.due_buffers = round(blks / calls, 1)
            reads = after.index_reads.get(DUE_INDEX, 0) - before.index_reads.get(DUE_INDEX, 0)
            sample.due_index_reads = round(reads / calls, 1)

    def _database(self, sample: Sample, conn: Connection) -> None:
        row = conn.execute(
            DEAD_AND_SIZES, {"due_index": DUE_INDEX, "outbox_index": OUTBOX_INDEX}
        ).one()
        sample.dead_reminders, sample.dead_outbox = int(row[0] or 0), int(row[1] or 0)
        sample.autovacuums = int(row[2] or 0) + int(row[3] or 0)
        sample.due_index_mb = round(int(row[4]) / 2**20, 2)
        sample.outbox_index_mb = round(int(row[5]) / 2**20, 2)
        # The feeder's insert and this session are young; the oldest holder is what matters.
        holders = [
            h
            for h in metrics_repository.snapshot_holders(conn, limit=5)
            if h.application_name != FEEDER_NAME
        ]
        if holders:
            sample.holder = holders[0].application_name or f"pid {holders[0].pid}"
            sample.holder_age_s = (
                None if holders[0].age_seconds is None else round(holders[0].age_seconds, 1)
            )
            sample.holder_xmin_age = holders[0].xmin_age


def _last_json(out: str) -> dict | None:
    """The command's JSON object (indented, the last thing it printed)."""
    start = out.rfind("\n{")
    with contextlib.suppress(ValueError):
        data = json.loads(out[start + 1 :] if start >= 0 else out)
        return data if isinstance(data, dict) else None
    return None


# --- setting a stack up -----------------------------------------------------------------------


def prepare(name: str, srv: Servers) -> Stack:
    """The application's database at head with ``pg_stat_statements``, the harness role, the
    topic, the dispatch command's environment."""
    from reminder_pipeline.messaging.kafka import ensure_topic
    from reminder_pipeline.store import migrate
    from reminder_pipeline.store.engine import make_engine

    app_db = srv.create_database(f"shared_{name.lower()}")
    engine = make_engine(srv.url(app_db), pool_size=1)
    migrate.upgrade(engine)
    engine.dispose()
    with srv.admin() as conn:
        conn.execute(f"CREATE ROLE {HARNESS_ROLE} LOGIN SUPERUSER")
    with psycopg.connect(srv.dsn(app_db), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    ensure_topic(srv.kafka)
    harness_url = make_url(srv.url(app_db)).set(username=HARNESS_ROLE)
    engine = make_engine(
        harness_url.render_as_string(hide_password=False),
        pool_size=1,
        application_name=f"rpb-shared-db-{name}",
        statement_timeout_ms=600_000,
    )
    harness_dsn = (
        harness_url.set(drivername="postgresql", query={"application_name": FEEDER_NAME})
    ).render_as_string(hide_password=False)
    home = srv.workdir / f"home-{name}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("REMINDER_")},
        "DATABASE_URL": srv.url(app_db),
        "KAFKA_BOOTSTRAP_SERVERS": srv.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(home),
    }
    return Stack(name, srv, app_db, engine, harness_dsn, env, srv.workdir / f"dispatch-{name}.log")
