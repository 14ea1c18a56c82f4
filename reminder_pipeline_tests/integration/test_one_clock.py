"""One clock: a dispatcher host whose clock is 10 minutes fast sends nothing early.

A real ``reminder-pipeline dispatch`` runs against the real database with its wall clock shifted
inside the Python process only (a ``sitecustomize`` on PYTHONPATH patching ``time.time`` and
``datetime.now``; Debian's ``faketime`` also shifts librdkafka's timed waits). What is due, and
the SentAt it records, come from the database server's clock; an operator's AsOf is checked
against it; the skew is logged, recorded in the metrics ledger, served as a gauge and fails the
``clock_skew`` warning check.
"""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline.observability import exporter, health

from ..support import make_due_event, make_event, reminders, run_cli, utcnow

FAST_SECONDS = 600

SITECUSTOMIZE = """
    import datetime as _dt
    import os
    import time as _time

    _SHIFT = float(os.environ["FAST_CLOCK_SECONDS"])
    _real_time, _real_time_ns, _real = _time.time, _time.time_ns, _dt.datetime
    _time.time = lambda: _real_time() + _SHIFT
    _time.time_ns = lambda: _real_time_ns() + int(_SHIFT * 1e9)


    class _Any(type):
        # datetimes made by C code (psycopg) are the real class: still datetimes.
        def __instancecheck__(cls, obj):
            return isinstance(obj, _real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, _real)


    class _FastDatetime(_real, metaclass=_Any):
        @classmethod
        def now(cls, tz=None):
            return _real.now(tz) + _dt.timedelta(seconds=_SHIFT)

        @classmethod
        def utcnow(cls):
            return _real.utcnow() + _dt.timedelta(seconds=_SHIFT)


    _dt.datetime = _FastDatetime
"""


def _database_now(engine):
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()


@pytest.fixture
def fast_clock_env(tmp_path, database_url, kafka_settings):
    site = tmp_path / "fast_clock"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(site),
        "FAST_CLOCK_SECONDS": str(FAST_SECONDS),
    }


def test_a_fast_host_sends_nothing_early_and_records_sent_at_on_the_database_clock(
    engine, fast_clock_env
):
    due = make_due_event(engine, minutes_overdue=1)
    now = utcnow()
    # Five reminders due in 5-9 minutes: due by the fast host's clock, not by the database's.
    early = [
        make_event(
            engine,
            start_at=now + timedelta(minutes=60 + minutes),
            offsets=(60,),
            now=now - timedelta(days=2),
        )
        for minutes in range(5, 10)
    ]

    before = _database_now(engine)
    result = run_cli("dispatch", "--json", "--no-relay", env=fast_clock_env)
    after = _database_now(engine)

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sent"] == 1
    assert all(reminders(engine, e)[0]["status"] == "Pending" for e in early)
    [sent] = reminders(engine, due)
    assert sent["status"] == "Sent"
    assert before <= sent["sent_at"] <= after
    # Counted and logged, never trusted.
    assert report["clock_skew_seconds"] == pytest.approx(FAST_SECONDS, abs=30)
    assert "host clock differs from the database's" in result.stderr


def test_an_operators_as_of_is_checked_against_the_database_clock(engine, fast_clock_env):
    # Five minutes ahead of the database: "now" on the fast host, the future for the database.
    ahead = (_database_now(engine) + timedelta(minutes=5)).isoformat()
    result = run_cli("dispatch", "--no-relay", "--as-of", ahead, env=fast_clock_env)
    assert result.returncode != 0
    assert "is in the future" in result.stderr


def test_the_skew_is_counted_a_gauge_and_a_warning_check(engine, fast_clock_env):
    healthy = health.clock_skew(engine, utcnow())
    assert healthy.passed
    result = run_cli("dispatch", "--no-relay", env=fast_clock_env)
    assert result.returncode == 0, result.stderr

    check = health.clock_skew(engine, utcnow())
    assert not check.passed and check.severity == "WARN"
    assert check.metadata["skewed_cycles"] == 1
    assert check.metadata["max_abs_clock_skew_seconds"] == pytest.approx(FAST_SECONDS, abs=30)
    gauges = {m.name: m.samples[0].value for m in exporter.families(exporter.read_snapshot(engine))}
    assert gauges[exporter.CLOCK_SKEWED_CYCLES] == 1
    assert gauges[exporter.CLOCK_SKEW] == pytest.approx(FAST_SECONDS, abs=30)
