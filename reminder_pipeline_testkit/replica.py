"""A primary and an asynchronous streaming replica from the embedded PostgreSQL binaries, and a
failover that loses the primary's last commits (issue 34), as managed PostgreSQL's does.

:class:`ReplicaPair` starts the primary (the embedded server's ``initdb`` already gives
``wal_level = replica``, ten WAL senders and ``host replication all 127.0.0.1/32 trust``), takes
``pg_basebackup -R -X stream`` of it into the replica's data directory, starts the replica on a
port of its own and waits until it streams. Clients reach whichever is writable through one URL,
SQLAlchemy's multi-host form (:meth:`ReplicaPair.url`)::

    postgresql+psycopg://postgres@/db?host=127.0.0.1:P1&host=127.0.0.1:P2&target_session_attrs=read-write

The failover (:meth:`ReplicaPair.failover`): the primary's WAL senders are stopped (SIGSTOP)
so what it commits from then on never reaches the replica, the primary goes on committing for a
while (``hold_s``, or until the caller's ``until()`` says enough was lost), every process of the
primary is SIGKILLed (nothing it held in memory or had not shipped survives), and the replica is
promoted (``pg_promote``). The old primary is never started again (that would be a split brain);
:meth:`ReplicaPair.rejoin` puts a fresh replica of the new primary in its place (the same port,
so the URL stays valid for a second failover).

The pair also answers what the soak's stack (``benchmarks._soak_stack.Stack``) asks of its
server (``port``, ``start``, ``stop``, ``url``, ``pid``), acting on whichever server is the
primary now. Used by ``reminder_pipeline_tests/faults/test_failover.py`` and the soak's failover
fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from reminder_pipeline.config import libpq_url
from reminder_pipeline.local.postgres import PG_SUPERUSER, EmbeddedPostgres
from reminder_pipeline.local.servers import ServiceError, free_port

#: How long the replica may take to stream after it started, and to finish a promotion.
STREAMING_TIMEOUT_S = 60.0
PROMOTE_TIMEOUT_S = 60.0
#: What the primary goes on committing after its WAL stopped shipping, by default (the issue's
#: measured failover cut the stream 2.5 s before the kill).
DEFAULT_HOLD_S = 2.5


@dataclass
class StandbyPostgres(EmbeddedPostgres):
    """An embedded server whose data directory is a base backup of ``source`` (``-R``: it starts
    as a streaming replica of it), made on first start where :class:`EmbeddedPostgres` runs
    ``initdb``."""

    source: str = ""  # a libpq conninfo of the server to copy

    def _initdb(self, bin_dir: Path) -> None:
        started = time.monotonic()
        result = self._run(
            bin_dir / "pg_basebackup",
            ["-D", str(self.data_dir), "-d", self.source, "-R", "-X", "stream", "-c", "fast", "-w"],
            timeout=300,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            detail = lines[-1] if lines else f"exit code {result.returncode}"
            raise ServiceError(f"pg_basebackup into {self.data_dir} failed: {detail}")
        # The copy carries the source's server log; the replica's own starts empty.
        with contextlib.suppress(OSError), self.log_file.open("w"):
            pass
        self.base_backup_s = time.monotonic() - started


@dataclass
class Unshipped:
    """What the killed primary took with it: WAL it wrote that the replica never received."""

    #: The primary's WAL position when its senders were stopped, and just before the kill.
    stopped_at_lsn: str
    killed_at_lsn: str
    #: What the replica had received when it was promoted.
    received_lsn: str
    #: Bytes of WAL lost (at least: the primary may have written more in the last instant).
    lost_wal_bytes: int
    #: Seconds the primary went on committing after its WAL stopped shipping.
    held_s: float
    #: Epoch seconds of the kill.
    killed_at: float


@dataclass
class Failover:
    """One failover: what was lost, and how long the promotion took."""

    unshipped: Unshipped
    #: Epoch seconds when the replica answered as the writable primary.
    promoted_at: float
    promote_s: float

    def line(self) -> str:
        """One line for a report."""
        u = self.unshipped
        return (
            f"primary SIGKILLed {u.held_s:.1f} s after its WAL stopped shipping "
            f"({u.lost_wal_bytes:,} bytes of WAL lost: {u.received_lsn} received, "
            f"{u.killed_at_lsn} written), replica promoted in {self.promote_s:.1f} s"
        )


class ReplicaPair:
    """An embedded primary and its asynchronous streaming replica, each on a free port."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1") -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.primary: EmbeddedPostgres = EmbeddedPostgres(
            self.workdir / "a" / "data", port=free_port(), host=host
        )
        self.replica: EmbeddedPostgres | None = self._standby(self.workdir / "b" / "data")
        #: The two ports of the URL, in its order; fixed for the pair's life (rejoin reuses one).
        self.ports = (self.primary.port, self.replica.port if self.replica else 0)
        self._generation = 0
        #: The primary's WAL position when its senders were stopped (None: shipping).
        self._stopped_at: str | None = None

    def _standby(self, data_dir: Path, port: int | None = None) -> StandbyPostgres:
        return StandbyPostgres(
            data_dir, port=port or free_port(), host=self.host, source=self._direct(self.primary)
        )

    # --- what EmbeddedPostgres answers (Stack's server) -----------------------------------------

    @property
    def port(self) -> int:
        """The primary's port now."""
        return self.primary.port

    @property
    def data_dir(self) -> Path:
        """The primary's data directory now."""
        return self.primary.data_dir

    def start(self) -> str:
        """Start the primary, then the replica (base-backed up on first start) and wait until it
        streams; idempotent, as :meth:`EmbeddedPostgres.start`. Returns :meth:`url`."""
        self.primary.start()
        if self.replica is not None:
            self.replica.start()
            self.wait_streaming()
        return self.url()

    def stop(self, mode: str = "fast") -> None:
        """Stop the primary, then the replica (``mode`` as :meth:`EmbeddedPostgres.stop`)."""
        self.primary.stop(mode)
        if self.replica is not None:
            self.replica.stop(mode)

    def pid(self) -> int | None:
        """The primary's postmaster."""
        return self.primary.pid()

    def url(self, database: str = "postgres", driver: str = "psycopg") -> str:
        """SQLAlchemy's multi-host URL of ``database``: whichever server is writable."""
        hosts = "&".join(f"host={self.host}:{port}" for port in self.ports if port)
        return (
            f"postgresql+{driver}://{PG_SUPERUSER}@/{database}?{hosts}"
            "&target_session_attrs=read-write"
        )

    def dsn(self, database: str = "postgres") -> str:
        """:meth:`url` as libpq reads it (psycopg.connect, psql)."""
        return libpq_url(self.url(database))

    @staticmethod
    def _direct(server: EmbeddedPostgres, database: str = "postgres") -> str:
        return f"host={server.host} port={server.port} user={PG_SUPERUSER} dbname={database}"

    # --- replication ----------------------------------------------------------------------------

    def wait_streaming(self, timeout: float = STREAMING_TIMEOUT_S) -> None:
        """Until the primary has a WAL sender streaming to the replica."""
        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(self._direct(self.primary), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchone()
            if row and row[0] > 0:
                return
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the replica on port {self.replica.port if self.replica else '?'} is not "
                    f"streaming from the primary after {timeout:.0f} s"
                )
            time.sleep(0.1)

    def _lsn(self, server: EmbeddedPostgres, query: str) -> str:
        with psycopg.connect(self._direct(server), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(query).fetchone()
        return str(row[0]) if row and row[0] is not None else "0/0"

    def stop_shipping(self) -> str:
        """SIGSTOP the primary's WAL senders: from now on nothing it writes reaches the replica
        (what was in flight on the socket still arrives). Returns the primary's WAL position at
        that moment; once stopped, a second call returns the first one's."""
        if self._stopped_at is not None:
            return self._stopped_at
        with psycopg.connect(self._direct(self.primary), autocommit=True) as conn:
            pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_replication").fetchall()]
            if not pids:
                raise ServiceError("the primary has no WAL sender to stop (no replica streaming)")
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            row = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        self._stopped_at = str(row[0]) if row else "0/0"
        return self._stopped_at

    def kill_primary(self) -> None:
        """SIGKILL every process of the primary at once (the postmaster and all its children)."""
        pid = self.primary.pid()
        if pid is None:
            raise ServiceError(f"the primary on port {self.primary.port} is not running")
        procs = [psutil.Process(pid)]
        with contextlib.suppress(psutil.Error):
            procs += psutil.Process(pid).children(recursive=True)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)

    def kill_primary_unshipped(
        self, *, hold_s: float = DEFAULT_HOLD_S, until: Callable[[], bool] | None = None
    ) -> Unshipped:
        """Stop the WAL stream, let the primary commit on for ``hold_s`` (or until ``until()``
        is true, polled, at most ``hold_s``), then SIGKILL it: its last commits are lost."""
        if self.replica is None:
            raise ServiceError("no replica: the pair has failed over already (rejoin first)")
        stopped_at = self.stop_shipping()
        started = time.monotonic()
        deadline = started + hold_s
        while time.monotonic() < deadline:
            if until is not None and until():
                break
            time.sleep(0.02 if until is not None else max(0.0, deadline - time.monotonic()))
        killed_at_lsn = self._lsn(self.primary, "SELECT pg_current_wal_lsn()")
        held = time.monotonic() - started
        self.kill_primary()
        killed_at = time.time()
        self._wait_stream_ended()
        received = self._lsn(
            self.replica,
            "SELECT COALESCE(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())",
        )
        with psycopg.connect(self._direct(self.replica), autocommit=True) as conn:
            row = conn.execute(
                "SELECT CAST(pg_wal_lsn_diff(%s, %s) AS bigint)", (killed_at_lsn, received)
            ).fetchone()
        return Unshipped(
            stopped_at, killed_at_lsn, received, max(0, int(row[0]) if row else 0), held, killed_at
        )

    def _wait_stream_ended(self, timeout: float = 10.0) -> None:
        """Until the replica's WAL receiver has seen its stream end (it has all it will get)."""
        assert self.replica is not None
        deadline = time.monotonic() + timeout
        with psycopg.connect(self._direct(self.replica), autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
                ).fetchone()
                if not row or row[0] == 0:
                    return
                time.sleep(0.05)

    def promote(self, timeout: float = PROMOTE_TIMEOUT_S) -> float:
        """Promote the replica (``pg_promote``, waiting); it becomes :attr:`primary`. Returns the
        seconds it took."""
        if self.replica is None:
            raise ServiceError("no replica to promote")
        started = time.monotonic()
        with psycopg.connect(self._direct(self.replica), autocommit=True) as conn:
            row = conn.execute("SELECT pg_promote(true, %s)", (int(timeout),)).fetchone()
            if not row or not row[0]:
                port, within = self.replica.port, f"{timeout:.0f} s"
                raise ServiceError(f"the replica on port {port} was not promoted within {within}")
        self.primary, self.replica = self.replica, None
        self._stopped_at = None
        return time.monotonic() - started

    def failover(
        self,
        *,
        hold_s: float = DEFAULT_HOLD_S,
        until: Callable[[], bool] | None = None,
        silent_s: float = 0.0,
    ) -> Failover:
        """:meth:`kill_primary_unshipped`, ``silent_s`` with no writable server (what a DNS or
        virtual-IP move takes), then :meth:`promote`."""
        unshipped = self.kill_primary_unshipped(hold_s=hold_s, until=until)
        if silent_s > 0:
            time.sleep(silent_s)
        promote_s = self.promote()
        return Failover(unshipped, time.time(), promote_s)

    def rejoin(self) -> None:
        """A fresh replica of the (new) primary where the old primary was: its data directory
        discarded, a new base backup on the same port. The URL keeps both servers."""
        if self.replica is not None:
            return
        free = next(p for p in self.ports if p != self.primary.port)
        self._generation += 1
        self.replica = self._standby(self.workdir / f"r{self._generation}" / "data", port=free)
        self.replica.start()
        self.wait_streaming()
