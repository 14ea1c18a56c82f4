"""What the embedded servers share: one-line errors, ports, processes, log tails and file locks."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

try:  # POSIX only; on other platforms start/stop are simply not serialised across processes.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


logger = logging.getLogger(__name__)

_POLL_INTERVAL_SECONDS = 0.02


class ServiceError(RuntimeError):
    """A one-line failure of an embedded server (port in use, missing binary, failed start)."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


def _one_line(text: str, limit: int = 400) -> str:
    """Collapse ``text`` to a single line of at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def port_in_use(host: str, port: int) -> bool:
    """True if something listens on, or holds a bind on, ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        pass
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR so a TIME_WAIT left by a server we just stopped does not count as "in use";
        # the servers themselves bind with SO_REUSEADDR too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """An ephemeral free TCP port on 127.0.0.1 (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _psutil() -> ModuleType:
    """psutil, which only the embedded servers need (the ``embedded`` extra installs it)."""
    try:
        import psutil
    except ImportError:
        raise ServiceError(
            "psutil is not installed: the embedded servers need "
            "pip install 'reminder-pipeline[embedded]'"
        ) from None
    module: ModuleType = psutil  # untyped (no stubs): the module as what it is
    return module


def _process(pid: int) -> psutil.Process | None:
    """The live (non-zombie) process ``pid``, or None."""
    psutil = _psutil()
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
        return None
    except psutil.AccessDenied:  # alive, owned by someone else; identity checks below will say no
        return None


def _cmdline(proc: psutil.Process) -> list[str]:
    """The process's argv, or [] when it cannot be read."""
    psutil = _psutil()
    try:
        return list(proc.cmdline())
    except (psutil.Error, OSError):
        return []


def _last_log_line(path: Path, keywords: tuple[str, ...] = ("FATAL", "PANIC", "ERROR")) -> str:
    """The last log line with one of ``keywords`` (else the last non-empty line), or ''."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    for line in reversed(lines):
        if any(k in line for k in keywords):
            return line
    return lines[-1] if lines else ""


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (serialises start/stop across processes)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
