"""The fault proxy and the packet drop against the real servers (issue 34, item 1).

Each mode of :class:`reminder_pipeline_testkit.fault_proxy.FaultProxy` in front of the session's
PostgreSQL, as a psycopg client sees it: pass answers; latency adds its delay to each direction of a
round trip; reset breaks a pooled connection and refuses new ones until pass; stuck leaves a query
unanswered (and new connections unconnected) until the proxy closes, and keeps the server's session
of a client that gave up until the network returns; a cut COMMIT errors on the client while the
server commits or rolls back, only on the connections of the application named. In front of a Tansu
broker: a producer's connections go through the proxy, and a stuck broker fails its delivery. And a
real packet drop (iptables in a network namespace of the test's own) is noticed by a libpq
connection with keepalives and ``tcp_user_timeout`` within seconds, not minutes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaError, Producer

from reminder_pipeline_testkit.fault_proxy import FaultProxy, start_broker_behind_proxy
from reminder_pipeline_testkit.netns import require_netns, run_in_own_network

from .conftest import psycopg_dsn

pytestmark = pytest.mark.server

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A wait that should end at once on a loaded machine; a hang fails here instead.
DEADLINE = 30.0


@pytest.fixture
def probe_table(database_url: str) -> str:
    """A table ``probe (id int)`` in the test's database, made directly (not through a proxy)."""
    with psycopg.connect(psycopg_dsn(database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (id int)")
    return database_url


def _ids(url: str) -> list[int]:
    with psycopg.connect(psycopg_dsn(url), autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM probe ORDER BY id")]


def _sessions(url: str, application_name: str) -> int:
    """Server sessions of ``application_name`` (seen directly, not through the proxy)."""
    with psycopg.connect(psycopg_dsn(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_pass_forwards_queries(database_url_via_proxy: str, pg_proxy: FaultProxy) -> None:
    with psycopg.connect(psycopg_dsn(database_url_via_proxy), autocommit=True) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        assert pg_proxy.connections() == 1


def test_latency_delays_each_direction(database_url_via_proxy: str, pg_proxy: FaultProxy) -> None:
    delay = 0.25
    with psycopg.connect(psycopg_dsn(database_url_via_proxy), autocommit=True) as conn:
        pg_proxy.set_mode("latency", delay=delay)
        started = time.monotonic()
        assert conn.execute("SELECT 1").fetchone() == (1,)
        # The query waits its delay on the way in, the answer its own on the way out.
        assert time.monotonic() - started >= 2 * delay
        pg_proxy.set_mode("pass")
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_reset_breaks_pooled_connections_until_pass(
    database_url_via_proxy: str, pg_proxy: FaultProxy
) -> None:
    engine = sa.create_engine(database_url_via_proxy, pool_size=1, pool_pre_ping=False)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        assert pg_proxy.connections() == 1  # pooled, idle, open
        pg_proxy.set_mode("reset")
        assert pg_proxy.connections() == 0
        with pytest.raises(sa.exc.OperationalError), engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        with pytest.raises(psycopg.OperationalError):  # new connections are closed at once
            psycopg.connect(psycopg_dsn(database_url_via_proxy), connect_timeout=10)
        pg_proxy.set_mode("pass")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_stuck_answers_nothing_until_the_proxy_closes(
    database_url_via_proxy: str, pg_proxy: FaultProxy
) -> None:
    dsn = psycopg_dsn(database_url_via_proxy)
    held = psycopg.connect(dsn, autocommit=True)
    outcome: dict[str, Any] = {}
    answered = threading.Event()

    def query() -> None:
        try:
            outcome["row"] = held.execute("SELECT 1").fetchone()
        except psycopg.OperationalError as exc:
            outcome["error"] = str(exc)
        answered.set()

    pg_proxy.set_mode("stuck")
    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    # A new connection is accepted and held too: libpq's own connect bound (2 s) ends it.
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        psycopg.connect(dsn, connect_timeout=2)
    assert not answered.is_set()
    # Back to pass: new connections work; the held one stays dead-silent.
    pg_proxy.set_mode("pass")
    with psycopg.connect(dsn, autocommit=True) as fresh:
        assert fresh.execute("SELECT 2").fetchone() == (2,)
    assert not answered.wait(1.0)
    pg_proxy.close()
    assert answered.wait(DEADLINE)
    assert "row" not in outcome and outcome["error"]
    held.close()


def test_stuck_keeps_the_server_session_until_the_network_returns(
    database_url: str, database_url_via_proxy: str, pg_proxy: FaultProxy
) -> None:
    """A client that gives up on a stuck peer closes its socket; the server does not hear of it."""
    held = psycopg.connect(
        psycopg_dsn(database_url_via_proxy), autocommit=True, application_name="rp-held"
    )
    pg_proxy.set_mode("stuck")
    held.close()
    _until(lambda: pg_proxy.connections() == 0, "the proxy to see the client's close")
    assert _sessions(database_url, "rp-held") == 1
    pg_proxy.set_mode("pass")
    _until(lambda: _sessions(database_url, "rp-held") == 0, "the server to see the close")


@pytest.mark.parametrize("server_gets_it", [True, False], ids=["committed", "rolled-back"])
def test_cut_commit_errors_on_the_client_and_the_server_decides(
    probe_table: str, database_url_via_proxy: str, pg_proxy: FaultProxy, server_gets_it: bool
) -> None:
    pg_proxy.cut_after(server_gets_it=server_gets_it, application_name="rp-victim")
    dsn = psycopg_dsn(database_url_via_proxy)
    # A bystander's commit goes through: the cut is only for the application named.
    with psycopg.connect(dsn, application_name="rp-bystander") as bystander:
        bystander.execute("INSERT INTO probe VALUES (1)")
    victim = psycopg.connect(dsn, application_name="rp-victim")
    victim.execute("INSERT INTO probe VALUES (%s)", (2,))
    with pytest.raises(psycopg.OperationalError):
        victim.commit()
    victim.close()
    assert pg_proxy.wait_cuts(1, DEADLINE)
    # The server has finished with the session (committed, or rolled back when it went).
    _until(lambda: _sessions(probe_table, "rp-victim") == 0, "the victim's session to end")
    assert _ids(probe_table) == ([1, 2] if server_gets_it else [1])
    assert pg_proxy.cuts_done() == 1


def test_cut_reaches_statements_of_the_extended_protocol(
    probe_table: str, database_url_via_proxy: str, pg_proxy: FaultProxy
) -> None:
    """Autocommit INSERTs through Parse/Bind/Execute/Sync: the statement is its own commit."""
    insert = rb"INSERT\s+INTO\s+probe"
    dsn = psycopg_dsn(database_url_via_proxy)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO probe VALUES (%s)", (1,), prepare=True)
        # Prepared already: only a Bind of the statement's name goes on the wire, no Parse.
        pg_proxy.cut_after(insert, server_gets_it=False)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO probe VALUES (%s)", (2,), prepare=True)
    assert pg_proxy.wait_cuts(1, DEADLINE)
    pg_proxy.cut_after(insert, server_gets_it=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO probe VALUES (%s)", (3,))
    assert pg_proxy.wait_cuts(2, DEADLINE)
    assert _ids(probe_table) == [1, 3]


@pytest.fixture
def broker_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, FaultProxy]]:
    """A Tansu broker of this test's own, advertised at (and reached through) a fault proxy."""
    servers, proxy, stop = start_broker_behind_proxy(tmp_path)
    try:
        yield servers, proxy
    finally:
        stop()


def test_a_broker_behind_the_proxy_is_reached_only_through_it(
    broker_behind_proxy: tuple[str, FaultProxy],
) -> None:
    servers, proxy = broker_behind_proxy
    delivered: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": servers,
            "message.timeout.ms": 3000,
            "allow.auto.create.topics": True,
        }
    )
    producer.produce("fault-probe", b"one", on_delivery=lambda err, _msg: delivered.append(err))
    producer.flush(DEADLINE)
    assert delivered == [None]
    assert proxy.connections() >= 1
    proxy.set_mode("stuck")
    producer.produce("fault-probe", b"two", on_delivery=lambda err, _msg: delivered.append(err))
    producer.flush(DEADLINE)
    assert len(delivered) == 2 and delivered[1] is not None
    assert delivered[1].code() == KafkaError._MSG_TIMED_OUT


def test_a_dropped_port_is_noticed_by_a_bounded_libpq_connection() -> None:
    """Real packet drops (no FIN, no RST, no ACK): keepalives and tcp_user_timeout end the read."""
    require_netns()
    result = run_in_own_network(
        [sys.executable, "-m", "reminder_pipeline_tests.faults.scenario_drop_probe"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    findings = json.loads(result.stdout.strip().splitlines()[-1])
    assert findings["before"] == 1
    assert findings["outcome"] == "failed", findings
    # Kernel-timed (tcp_user_timeout 5 s): the promise itself, 30 s, not a tight bound.
    assert findings["seconds"] < 30, findings
