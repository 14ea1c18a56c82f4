"""One clock: a dispatcher host whose clock is off sends nothing early and misleads no check.

A real ``reminder-pipeline dispatch`` runs against the real database with its wall clock shifted
inside the Python process only (a ``sitecustomize`` on PYTHONPATH patching ``time.time`` and
``datetime.now``; Debian's ``faketime`` also shifts librdkafka's timed waits). What is due, and
the SentAt it records, come from the database server's clock; an operator's AsOf is checked
against it; the skew is logged, recorded in the metrics ledger, served as a gauge and fails the
``clock_skew`` warning check. A host 20 minutes slow and one 2 days fast: the ledger's times are
the database's, so liveness reads right after a cycle and 5 minutes after the last one, the skew
check counts the cycle (and stops counting it when its window has passed), and the host's
roll-up folds exactly the rows older than its retention by the database's clock.
"""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import exporter, health, ledger

from ..support import (
    error_lines,
    make_due_event,
    make_event,
    record_cycle_at,
    reminders,
    run_cli,
    utcnow,
)

FAST_SECONDS = 600
#: The hosts of the issue: one 20 minutes slow, one 2 days fast.
SKEWS = {"host-20-min-slow": -20 * 60, "host-2-days-fast": 2 * 24 * 3600}

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


def _shifted_clock_env(tmp_path, database_url, kafka_settings, seconds: float) -> dict[str, str]:
    """The CLI's environment with its wall clock ``seconds`` ahead (negative: behind)."""
    site = tmp_path / "shifted_clock"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(site),
        "FAST_CLOCK_SECONDS": str(seconds),
    }


@pytest.fixture
def fast_clock_env(tmp_path, database_url, kafka_settings):
    return _shifted_clock_env(tmp_path, database_url, kafka_settings, FAST_SECONDS)


@pytest.fixture(params=list(SKEWS.values()), ids=list(SKEWS))
def skewed_host(request, tmp_path, database_url, kafka_settings):
    """(how far the host's clock is ahead, the CLI's environment on that host)."""
    shift = request.param
    return shift, _shifted_clock_env(tmp_path, database_url, kafka_settings, shift)


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


def test_a_slow_host_takes_an_as_of_the_database_accepts(
    engine, tmp_path, database_url, kafka_settings
):
    env = _shifted_clock_env(tmp_path, database_url, kafka_settings, SKEWS["host-20-min-slow"])
    due = make_due_event(engine, minutes_overdue=3)
    # A minute ago for the database: 19 minutes ahead of the slow host's clock.
    as_of = (_database_now(engine) - timedelta(minutes=1)).isoformat()

    result = run_cli("dispatch", "--json", "--no-relay", "--as-of", as_of, env=env)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sent"] == 1
    assert reminders(engine, due)[0]["status"] == "Sent"
    # A future one is still refused, in its one line, named as the operator gave it.
    ahead = (_database_now(engine) + timedelta(minutes=5)).isoformat()
    refused = run_cli("dispatch", "--no-relay", env={**env, "REMINDER_AS_OF": ahead})
    assert refused.returncode == 2
    [line] = error_lines(refused)
    assert line.endswith(f"REMINDER_AS_OF='{ahead}' is in the future; it must be <= now")


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


def _dispatch_on(env) -> None:
    result = run_cli("dispatch", "--no-relay", env=env)
    assert result.returncode == 0, result.stderr


def test_liveness_right_after_a_skewed_hosts_cycle_and_five_minutes_later(engine, skewed_host):
    _, env = skewed_host
    make_due_event(engine, minutes_overdue=1)
    before = _database_now(engine)
    _dispatch_on(env)
    after = _database_now(engine)

    [row] = _ledger(engine)
    assert before <= row["started_at"] <= row["finished_at"] <= after
    # Right after a successful cycle the dispatcher is alive (today: 1200 s ago, for a slow host).
    [live] = [c for c in health.evaluate(engine) if c.name == "dispatch_liveness"]
    assert live.passed, live.description
    assert live.metadata["seconds_since_last_success"] < 60
    # And dead once it stops (today: alive for 2 days, for a fast host).
    dead = health.liveness(engine, after + timedelta(minutes=6))
    assert not dead.passed
    assert 355 <= dead.metadata["seconds_since_last_success"] <= 420


def test_the_skew_check_sees_a_slow_host_as_well_as_a_fast_one(engine, skewed_host):
    shift, env = skewed_host
    _dispatch_on(env)

    [check] = [c for c in health.evaluate(engine) if c.name == "clock_skew"]
    assert not check.passed, check.description
    assert (check.metadata["skewed_cycles"], check.metadata["measured_cycles"]) == (1, 1)
    assert check.metadata["max_abs_clock_skew_seconds"] == pytest.approx(abs(shift), abs=30)
    gauges = {m.name: m.samples[0].value for m in exporter.families(exporter.read_snapshot(engine))}
    assert gauges[exporter.CLOCK_SKEWED_CYCLES] == 1
    # The warning ends with its window, as for any host (not 2 days later).
    later = _database_now(engine) + ledger.CLOCK_SKEW_WINDOW + timedelta(minutes=1)
    assert health.clock_skew(engine, later).passed


def test_a_skewed_hosts_roll_up_folds_by_the_database_clock(engine, skewed_host):
    _, env = skewed_host
    now = _database_now(engine)
    old = now - ledger.DETAIL_RETENTION - timedelta(minutes=10)
    record_cycle_at(engine, "older-than-the-window", CycleCounts(sent=1), old)
    record_cycle_at(
        engine, "another-host-just-now", CycleCounts(sent=2), now - timedelta(seconds=5)
    )

    _dispatch_on(env)  # its ledger write rolls up what the retention allows

    kept = {r["run_id"] for r in _ledger(engine)}
    assert "another-host-just-now" in kept  # today: folded by a host 2 days fast
    assert "older-than-the-window" not in kept  # today: kept by a host 20 minutes slow
    checks = {c.name: c for c in health.evaluate(engine)}
    assert checks["dispatch_errors"].metadata["cycles_in_window"] == 2


def _ledger(engine) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM dispatch_cycles ORDER BY id"))
        return [dict(r._mapping) for r in rows]
