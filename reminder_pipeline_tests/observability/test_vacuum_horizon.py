"""Who holds back vacuum, and what it costs the dispatcher: the exporter and the ``vacuum_horizon`` check.

Against the real database: a second session holds a REPEATABLE READ snapshot, as a report or a
``pg_dump`` of the shared calendar database does. The exporter (scraped over HTTP, parsed with
prometheus_client's parser) and the check name that session (pid, application name, state, how
old its xmin is); the check warns once the snapshot is older than 15 minutes (evaluated at a
``now`` past it) and fails as an error when the dispatcher's cycles slow meanwhile (ledger rows
at chosen times). Another role's snapshot, which pg_stat_activity shows without its start or
state, is still named and dated by the ledger. The due index's statistics show each scan reading
the entries such a snapshot keeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import psycopg
import pytest
from sqlalchemy.engine import Engine, make_url

from reminder_pipeline import cycle
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import health, ledger, metric_names
from reminder_pipeline.store import metrics_repository, repository, tables
from reminder_pipeline.store.engine import make_engine

from ..support import bulk_due, make_due_event, record_cycle_at
from .helpers import exporter_settings, scrape

REPORT = "nightly-report"
PAST_THRESHOLD = timedelta(seconds=health.SNAPSHOT_OLD_SECONDS + 60)


def _dsn(url: str, **more: str) -> str:
    return make_url(url).set(drivername="postgresql", **more).render_as_string(hide_password=False)


@contextmanager
def held_snapshot(url: str, application_name: str = REPORT) -> Iterator[int]:
    """A session holding a REPEATABLE READ snapshot until the block ends; yields its pid."""
    with psycopg.connect(_dsn(url), autocommit=True, application_name=application_name) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM event_reminders")
        try:
            yield conn.info.backend_pid
        finally:
            conn.execute("ROLLBACK")


def _database_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return repository.database_clock(conn)


def _transactions(engine: Engine, n: int = 3) -> None:
    """``n`` committed writes: the held snapshot's xmin grows older by as many transactions."""
    for _ in range(n):
        make_due_event(engine, minutes_overdue=-60)  # due in an hour: nothing to dispatch


@pytest.fixture
def metrics(database_url: str) -> Iterator[str]:
    """A running exporter on the test's database; yields its URL."""
    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    yield running.url
    running.stop()


def test_a_held_snapshot_is_named_by_the_exporter_and_the_check_which_warns_past_15_minutes(
    engine, database_url, metrics
):
    quiet = scrape(metrics)
    assert quiet.value(metric_names.OLDEST_SNAPSHOT_AGE) == 0
    assert quiet.value(metric_names.OLDEST_SNAPSHOT_XMIN_AGE) == 0
    assert metric_names.OLDEST_SNAPSHOT_HOLDER not in quiet.sample_families()
    check = health.vacuum_horizon(engine, _database_now(engine) + PAST_THRESHOLD)
    assert check.passed and check.description == "Nothing holds back vacuum."

    with held_snapshot(database_url) as pid:
        _transactions(engine)
        held = scrape(metrics)
        [holder] = held.families[metric_names.OLDEST_SNAPSHOT_HOLDER].samples
        assert holder.value == 1
        assert holder.labels == {
            "kind": "session",
            "pid": str(pid),
            "application_name": REPORT,
            "client_addr": "127.0.0.1",
            "state": "idle in transaction",
        }
        assert held.value(metric_names.OLDEST_SNAPSHOT_XMIN_AGE) >= 3
        assert held.value(metric_names.OLDEST_SNAPSHOT_AGE) > 0

        with engine.connect() as conn:  # ages to the statement's clock, as the cycle reads it
            [first] = metrics_repository.snapshot_holders(conn, limit=1)
        assert first.pid == pid and first.age_seconds is not None and first.xmin_age >= 3

        now = _database_now(engine)
        young = health.vacuum_horizon(engine, now)
        assert young.passed, young.description  # named, not yet old
        assert young.metadata["holder_pid"] == pid
        assert young.description.startswith("Oldest snapshot ")

        old = health.vacuum_horizon(engine, now + PAST_THRESHOLD)
        assert not old.passed and old.severity == "WARN"
        meta = old.metadata
        assert (meta["holder_kind"], meta["holder_pid"]) == ("session", pid)
        assert (meta["holder_application_name"], meta["holder_state"]) == (
            REPORT,
            "idle in transaction",
        )
        assert meta["holder_client_addr"] == "127.0.0.1"
        assert meta["holder_xact_start"] is not None and meta["holder_query_start"] is not None
        assert meta["holder_xmin_age"] >= 3 and meta["oldest_snapshot_xmin_age"] >= 3
        assert meta["holder_age_seconds"] >= PAST_THRESHOLD.total_seconds()
        assert meta["oldest_snapshot_age_seconds"] >= PAST_THRESHOLD.total_seconds()
        assert meta["threshold_seconds"] == health.SNAPSHOT_OLD_SECONDS
        assert meta["runbook_url"] == health.RUNBOOK_VACUUM
        assert f"pid {pid} ('{REPORT}'" in old.description
        assert "holds back vacuum" in old.description and "keeps its pace" in old.description
        # What it costs is read from PostgreSQL's statistics, free to read.
        assert meta["due_index_size_bytes"] > 0 and meta["unpublished_index_size_bytes"] > 0
        assert meta["event_reminders_live_rows"] is not None

    released = scrape(metrics)
    assert released.value(metric_names.OLDEST_SNAPSHOT_AGE) == 0
    assert metric_names.OLDEST_SNAPSHOT_HOLDER not in released.sample_families()
    assert health.vacuum_horizon(engine, _database_now(engine) + PAST_THRESHOLD).passed


def test_an_old_snapshot_while_the_cycles_slow_is_an_error(engine, database_url):
    now = _database_now(engine)
    later = now + PAST_THRESHOLD
    # Six hours of cycles of 0.2 s, then the last ten minutes at 2 s each: ten times slower.
    for minutes in range(20, 360, 10):
        record_cycle_at(
            engine,
            f"usual-{minutes}",
            CycleCounts(),
            later - timedelta(minutes=minutes),
            duration_seconds=0.2,
        )
    for minutes in (2, 5, 8):
        record_cycle_at(
            engine,
            f"slow-{minutes}",
            CycleCounts(),
            later - timedelta(minutes=minutes),
            duration_seconds=2.0,
        )
    slowing_alone = health.vacuum_horizon(engine, later)
    assert slowing_alone.passed, slowing_alone.description  # slow for another reason: not this
    assert slowing_alone.metadata["slowdown_ratio"] > health.SLOWING_FACTOR

    with held_snapshot(database_url) as pid:
        _transactions(engine)
        check = health.vacuum_horizon(engine, later)
    assert not check.passed and check.severity == "ERROR"
    assert check.metadata["holder_pid"] == pid
    assert (
        check.metadata["cycle_duration_p50_seconds"]
        > check.metadata["cycle_duration_p50_baseline_seconds"] * health.SLOWING_FACTOR
    )
    assert "The dispatcher slows meanwhile" in check.description


@pytest.fixture
def roles(database_url: str) -> Iterator[dict[str, str]]:
    """Two logins of their own, neither with pg_read_all_stats: a reporter that may read the
    reminders, and a watcher that may read every table (what the exporter reads); their URLs."""
    suffix = uuid.uuid4().hex[:8]
    names = {"reporter": f"rp_report_{suffix}", "watcher": f"rp_watch_{suffix}"}
    password = uuid.uuid4().hex
    with psycopg.connect(_dsn(database_url), autocommit=True) as admin:
        for name in names.values():
            admin.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
        admin.execute(f'GRANT SELECT ON event_reminders TO "{names["reporter"]}"')
        admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{names["watcher"]}"')
    url = make_url(database_url)
    yield {
        role: url.set(username=name, password=password).render_as_string(hide_password=False)
        for role, name in names.items()
    }
    with psycopg.connect(_dsn(database_url), autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'DROP OWNED BY "{name}"')
            admin.execute(f'DROP ROLE "{name}"')


def test_another_roles_snapshot_is_named_and_dated_by_the_ledger(engine, roles):
    watcher = make_engine(roles["watcher"])
    try:
        with held_snapshot(roles["reporter"]) as pid:
            _transactions(engine)
            # A cycle's ledger row written after the snapshot began: it dates the horizon.
            ledger.record_cycle(engine, "after-the-snapshot", CycleCounts())
            snapshot = exp.read_snapshot(watcher)
            assert snapshot.horizon is not None
            oldest = snapshot.horizon.oldest
            assert oldest is not None
            # pg_stat_activity hides its start, state and client from another role; its pid,
            # name and xmin are shown to every role.
            assert (oldest.kind, oldest.pid, oldest.application_name) == ("session", pid, REPORT)
            assert oldest.state is None and oldest.xact_start is None and oldest.age_seconds is None
            assert oldest.xmin_age is not None and oldest.xmin_age >= 3
            assert snapshot.horizon.held_by is not None

            check = health.vacuum_horizon(watcher, _database_now(engine) + PAST_THRESHOLD)
        assert not check.passed and check.severity == "WARN", check.description
        assert check.metadata["holder_pid"] == pid
        assert check.metadata["holder_state"] is None
        assert check.metadata["horizon_held_by"] is not None
        assert check.metadata["oldest_snapshot_age_seconds"] >= PAST_THRESHOLD.total_seconds()
        assert "state hidden (no pg_read_all_stats)" in check.description
    finally:
        watcher.dispose()


def _scan_due_index(url: str) -> None:
    """One scan of the due index from its oldest end (what a due scan without a lower bound, the
    backlog count and the full sweep do), its statistics flushed before this returns."""
    with psycopg.connect(_dsn(url), autocommit=True, application_name="due-scan") as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        conn.execute(
            "SELECT count(*) FROM event_reminders WHERE status = 'Pending' AND due_at < now()"
        )
        # Its counts reach the shared statistics when the session next goes idle (at once).
        conn.execute("SELECT pg_stat_force_next_flush()")


def _not_fetched(engine: Engine) -> int:
    """Entries of the due index read and not fetched, as the exporter serves them."""
    families = {m.name: m for m in exp.families(exp.read_snapshot(engine))}
    samples = {
        (s.name, s.labels["index"]): s.value
        for name in (metric_names.INDEX_ENTRIES_READ, metric_names.INDEX_ENTRIES_FETCHED)
        for s in families[name.removesuffix("_total")].samples
    }
    due = metrics_repository.DUE_INDEX
    return int(
        samples[metric_names.INDEX_ENTRIES_READ, due]
        - samples[metric_names.INDEX_ENTRIES_FETCHED, due]
    )


def test_each_due_scan_reads_the_entries_a_held_snapshot_keeps(engine, database_url):
    bulk_due(engine, 300)
    with held_snapshot(database_url):
        report = cycle.run_cycle(engine, None, batch_size=500)
        assert report.counts.sent == 300  # 300 entries of the due index dead, kept
        before = _not_fetched(engine)
        _scan_due_index(database_url)
        once = _not_fetched(engine)
        _scan_due_index(database_url)
        twice = _not_fetched(engine)
    # Every scan steps over all of them again: none can be marked dead while the snapshot lasts.
    assert once - before >= 300 and twice - once >= 300


def test_the_watched_indexes_and_tables_are_the_declared_ones():
    declared = {i.name for t in tables.metadata.tables.values() for i in t.indexes}
    assert set(metrics_repository.WATCHED_INDEXES) <= declared
    assert set(metrics_repository.WATCHED_TABLES) <= set(tables.metadata.tables)
