"""The embedded default servers against the real binaries (PostgreSQL 18 and Tansu)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import reminder_pipeline.local.postgres as embedded_postgres
from reminder_pipeline.local.servers import (
    EmbeddedBroker,
    EmbeddedPostgres,
    ServiceError,
    free_port,
    port_in_use,
)

#: Each test starts the embedded servers itself.
pytestmark = pytest.mark.server


def _conninfo(pg: EmbeddedPostgres, dbname: str = "postgres") -> str:
    return f"host={pg.host} port={pg.port} user=postgres dbname={dbname} connect_timeout=5"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A foreign listening socket on a free port of 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock
    finally:
        sock.close()


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "home" / "pgdata", port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    server = EmbeddedBroker(tmp_path / "broker", port=free_port())
    try:
        yield server
    finally:
        server.stop()


# -- helpers --------------------------------------------------------------------------------------


def test_port_in_use_and_free_port(listener: socket.socket) -> None:
    assert port_in_use("127.0.0.1", listener.getsockname()[1])
    port = free_port()
    assert 0 < port < 65536
    assert not port_in_use("127.0.0.1", port)


def test_port_in_use_sees_a_bound_but_not_listening_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        assert port_in_use("127.0.0.1", sock.getsockname()[1])


# -- PostgreSQL -----------------------------------------------------------------------------------


def test_pg_start_accepts_connections(pg: EmbeddedPostgres) -> None:
    assert pg.is_running()
    assert pg.url() == f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"
    assert pg.url("x", driver="psycopg2") == f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/x"
    with psycopg.connect(_conninfo(pg)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        settings = conn.execute(
            "SELECT current_setting('max_connections'), current_setting('fsync'),"
            " pg_encoding_to_char(encoding) FROM pg_database WHERE datname = 'postgres'"
        ).fetchone()
        assert settings == ("200", "on", "UTF8")


def test_pg_start_twice_is_harmless(pg: EmbeddedPostgres) -> None:
    pid = pg.pid()
    assert pid is not None
    assert pg.start() == pg.url()
    assert pg.pid() == pid
    # A second handle on the same data dir finds the same server.
    assert EmbeddedPostgres(pg.data_dir, port=pg.port).start() == pg.url()
    assert pg.pid() == pid


def test_pg_restart_reuses_data(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(_conninfo(pg), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    version_mtime = (pg.data_dir / "PG_VERSION").stat().st_mtime_ns
    pg.stop()
    assert not pg.is_running()
    assert pg.pid() is None
    pg.stop()  # harmless when stopped
    assert pg.start() == pg.url()
    assert (pg.data_dir / "PG_VERSION").stat().st_mtime_ns == version_mtime  # no re-initdb
    with psycopg.connect(_conninfo(pg)) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [(42,)]


def test_pg_ensure_database(pg: EmbeddedPostgres) -> None:
    url = pg.ensure_database("reminders_test")
    assert url == pg.url("reminders_test")
    assert pg.ensure_database("reminders_test") == url  # idempotent
    with psycopg.connect(_conninfo(pg, "reminders_test")) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("reminders_test",)


def _write_stale_pid_file(pg: EmbeddedPostgres, lines: list[str], pid: int) -> None:
    pid_file = pg.data_dir / "postmaster.pid"
    pid_file.write_text("\n".join([str(pid), *lines[1:]]) + "\n")
    st = pg.data_dir.stat()
    os.chown(pid_file, st.st_uid, st.st_gid)


def test_pg_starts_over_stale_pid_files(pg: EmbeddedPostgres) -> None:
    lines = (pg.data_dir / "postmaster.pid").read_text().splitlines()
    pg.stop()
    dead = _dead_pid()
    _write_stale_pid_file(pg, lines, dead)  # the process is gone
    assert not pg.is_running()
    assert pg.start() == pg.url()
    assert pg.is_running()
    pg.stop()
    # PID reused by a non-postgres process of the server's own user (postgres ignores processes
    # it may not signal, so the process must belong to the data dir's owner to be a real obstacle).
    owner = pg.data_dir.stat().st_uid
    kwargs = {"user": owner} if os.geteuid() == 0 and owner != 0 else {}
    squatter = subprocess.Popen(["sleep", "60"], **kwargs)
    try:
        _write_stale_pid_file(pg, lines, squatter.pid)
        assert not pg.is_running()
        assert pg.start() == pg.url()
        assert pg.is_running()
    finally:
        squatter.kill()
        squatter.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_pg_port_in_use_is_one_line(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    server = EmbeddedPostgres(tmp_path / "pgdata", port=port)
    with pytest.raises(ServiceError) as info:
        server.start()
    message = str(info.value)
    assert "\n" not in message
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert not server.is_running()
    server.stop()  # harmless


def test_pg_on_other_port_is_refused(pg: EmbeddedPostgres) -> None:
    other = EmbeddedPostgres(pg.data_dir, port=free_port())
    assert not other.is_running()
    with pytest.raises(ServiceError, match=str(pg.port)) as info:
        other.start()
    assert "\n" not in str(info.value)
    assert pg.is_running()


def test_pg_missing_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        embedded_postgres, "_postgres_bin_dir", lambda: tmp_path / "nowhere" / "bin"
    )
    with pytest.raises(ServiceError, match="initdb") as info:
        EmbeddedPostgres(tmp_path / "pgdata", port=free_port()).start()
    assert "\n" not in str(info.value)


def test_pg_ensure_database_when_down(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pgdata", port=free_port())
    assert not server.is_running()
    with pytest.raises(ServiceError, match="cannot create database") as info:
        server.ensure_database("x")
    assert "\n" not in str(info.value)


# -- broker ---------------------------------------------------------------------------------------


def test_broker_start_twice_stop(broker: EmbeddedBroker) -> None:
    assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
    assert not broker.is_running()
    broker.stop()  # harmless before start
    assert broker.start() == broker.bootstrap_servers
    assert broker.is_running()
    pid = broker.pid()
    assert pid is not None
    assert broker.pid_file.read_text().strip() == str(pid)
    assert broker.start() == broker.bootstrap_servers
    assert broker.pid() == pid
    assert EmbeddedBroker(broker.state_dir, port=broker.port).start() == broker.bootstrap_servers
    assert broker.pid() == pid
    broker.stop()
    assert not broker.is_running()
    assert not broker.pid_file.exists()
    assert not port_in_use(broker.host, broker.port)
    broker.stop()  # harmless twice
    assert broker.start() == broker.bootstrap_servers  # and it comes back on the same port
    assert broker.is_running()
    assert broker.pid() != pid


def test_broker_speaks_kafka(broker: EmbeddedBroker) -> None:
    from confluent_kafka.admin import AdminClient

    broker.start()
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [broker.bootstrap_servers]


def test_broker_port_in_use_is_one_line(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    server = EmbeddedBroker(tmp_path / "broker", port=port)
    with pytest.raises(ServiceError) as info:
        server.start()
    message = str(info.value)
    assert "\n" not in message
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert not server.pid_file.exists()


def test_broker_missing_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-tansu"))
    with pytest.raises(ServiceError, match="broker binary not found") as info:
        EmbeddedBroker(tmp_path / "broker", port=free_port()).start()
    assert "\n" not in str(info.value)


def test_broker_stale_pid_file(broker: EmbeddedBroker) -> None:
    broker.state_dir.mkdir(parents=True)
    broker.pid_file.write_text(f"{os.getpid()}\n")  # not a broker: must be ignored
    assert broker.pid() is None
    assert not broker.is_running()
    broker.start()
    assert broker.is_running()
    assert broker.pid() != os.getpid()


# -- both, detached -------------------------------------------------------------------------------


def test_servers_outlive_the_starting_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A data dir whose socket path is too long for a unix socket also exercises the fallback.
    base = tmp_path_factory.mktemp("detached")
    pg = EmbeddedPostgres(base / ("d" * 90) / "pgdata", port=free_port())
    broker = EmbeddedBroker(base / "broker", port=free_port())
    assert pg._socket_dir() != pg.data_dir
    script = textwrap.dedent(
        f"""
        from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres
        print(EmbeddedPostgres({str(pg.data_dir)!r}, port={pg.port}).start())
        print(EmbeddedBroker({str(broker.state_dir)!r}, port={broker.port}).start())
        """
    )
    package_root = Path(embedded_postgres.__file__).resolve().parent.parent
    pythonpath = os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    try:
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [pg.url(), broker.bootstrap_servers]
        assert pg.is_running()
        assert broker.is_running()
        with psycopg.connect(_conninfo(pg)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        broker.stop()
        pg.stop()
    assert not pg.is_running()
    assert not broker.is_running()
