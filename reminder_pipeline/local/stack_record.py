"""``up.json``: what one ``up`` started, and the only processes ``up``, its guard and ``services``
ever signal.

A process is acted on only when its pid, its start time and its command line are all what
``up`` recorded (read from ``/proc/<pid>/stat`` and ``/proc/<pid>/cmdline``): a pid reused by
another process, a hand edit, a damaged file never make us signal a stranger. An entry that
cannot be checked (a name ``up`` never records, a missing, zero or non-numeric pid or start
time, no command line) is ignored with one warning line; a file that is not a JSON object is
reported in one line and set aside as ``up.json.bad-<UTC time>``, and the commands go on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..logs import event

log = logging.getLogger("reminder_pipeline.local.stack_record")

#: The stack record's file name, in the project home (REMINDER_PIPELINE_HOME).
RECORD_NAME = "up.json"
#: The names `up` records; stopped in this order: `up` itself first (it stops the rest cleanly),
#: the daemon before the webserver so no new run is launched, the code server (where runs go)
#: last. The guard is never signalled.
NAMES = ("up", "daemon", "webserver", "code_server", "guard")
_PROC = Path("/proc")


@dataclass(frozen=True)
class Identity:
    """Who a process is: its pid, start time (clock ticks after boot) and command line."""

    pid: int
    started: int
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        """The live (not zombie) process ``pid`` as /proc shows it, or None."""
        if not _PROC.is_dir():  # pragma: no cover - not Linux: psutil's view (ms since epoch)
            return cls._of_psutil(pid)
        try:
            stat = (_PROC / str(pid) / "stat").read_text()
            raw = (_PROC / str(pid) / "cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; starttime is the
        # 22nd field, the 20th after comm.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 20 or fields[0] in ("Z", "X"):
            return None
        args = tuple(arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1])
        return cls(pid, int(fields[19]), args)

    @classmethod
    def of_started(cls, pid: int, timeout: float = 5.0) -> Identity | None:
        """:meth:`of` a process just started, once its exec has finished: the parent of a
        ``Popen`` may go on before the child's new command line is in /proc (the kernel closes
        the exec-closed pipe ``Popen`` waits on first), and an identity recorded then, with no
        command line, could never be acted on. Polls /proc for up to ``timeout`` seconds."""
        identity = cls.of(pid)
        deadline = time.monotonic() + timeout
        while identity is not None and not identity.cmdline and time.monotonic() < deadline:
            time.sleep(0.005)
            identity = cls.of(pid)
        return identity

    @classmethod
    def _of_psutil(cls, pid: int) -> Identity | None:  # pragma: no cover - not Linux
        import psutil

        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return cls(pid, round(proc.create_time() * 1000), tuple(proc.cmdline()))
        except psutil.Error:
            return None

    def as_entry(self) -> dict[str, object]:
        """The entry written to the record."""
        return {"pid": self.pid, "started": self.started, "cmdline": list(self.cmdline)}

    def alive(self) -> bool:
        """The very process recorded still runs (same pid, start time and command line)."""
        return Identity.of(self.pid) == self


def _entry(name: str, entry: object) -> Identity | str:
    """The recorded identity, or why the entry cannot be trusted."""
    if name not in NAMES:
        return "not a name up records"
    if not isinstance(entry, dict):
        return "not an object"
    pid, started, cmdline = entry.get("pid"), entry.get("started"), entry.get("cmdline")
    if type(pid) is not int or pid <= 0:
        return "no valid pid"
    if type(started) is not int or started <= 0:
        return "no valid start time"
    if not isinstance(cmdline, list) or not cmdline or not all(isinstance(a, str) for a in cmdline):
        return "no command line"
    return Identity(pid, started, tuple(cmdline))


class StackRecord:
    """``up.json``: the processes one ``up`` started (name -> pid, start time, command line)."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home).expanduser().resolve() / RECORD_NAME
        self._warned: set[str] = set()

    def _warn_once(self, message: str, **fields: object) -> None:
        key = f"{message} {fields}"
        if key not in self._warned:
            self._warned.add(key)
            event(log, logging.WARNING, message, path=str(self.path), **fields)

    def entries(self) -> dict[str, Identity]:
        """The trustworthy entries; a malformed file is set aside, bad entries are ignored."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:  # unreadable, not UTF-8
            return self._set_aside(type(error).__name__)
        try:
            data = json.loads(text)
        except ValueError:
            return self._set_aside("not JSON")
        if not isinstance(data, dict):
            return self._set_aside("not a JSON object")
        entries, ignored = {}, {}
        for name, entry in data.items():
            checked = _entry(str(name), entry)
            if isinstance(checked, Identity):
                entries[str(name)] = checked
            else:
                ignored[str(name)] = checked
        if ignored:
            self._warn_once(
                "stack record: entries ignored, nothing of theirs is signalled", **ignored
            )
        return entries

    def _set_aside(self, why: str) -> dict[str, Identity]:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        with contextlib.suppress(OSError):
            self.path.replace(aside)
        self._warn_once("stack record malformed; set aside", reason=why, moved_to=str(aside))
        return {}

    def add(self, name: str, pid: int) -> None:
        """Record ``pid`` as ``name`` (written atomically: a reader never sees half a file)."""
        if name not in NAMES:
            raise ValueError(f"up records no process named {name!r}")
        identity = Identity.of_started(pid)
        entries = self.entries()
        if identity is None:  # gone already: nothing to record, nothing to stop later
            entries.pop(name, None)
        else:
            entries[name] = identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({n: e.as_entry() for n, e in entries.items()}))
        tmp.replace(self.path)

    def exists(self) -> bool:
        """True while the record is there (``up`` has not finished stopping everything)."""
        return self.path.exists()

    def remove(self) -> None:
        """Drop the record: everything in it has been stopped."""
        self.path.unlink(missing_ok=True)

    def running(self) -> dict[str, int]:
        """The recorded processes still alive as recorded, name -> pid (the guard left out)."""
        return {
            name: identity.pid
            for name, identity in self.entries().items()
            if name != "guard" and identity.alive()
        }

    def describe(self) -> str:
        """What runs, on one line: ``up pid 1, daemon pid 2, webserver pid 3``."""
        return ", ".join(f"{name} pid {pid}" for name, pid in self.running().items())

    def stop(self, timeout: float = 20.0, *, spare_up: bool = False) -> dict[str, int]:
        """Stop what runs: ``up`` by SIGTERM (it stops the rest), then the Dagster process groups.

        Each group gets SIGINT (Dagster's clean stop), then SIGKILL after ``timeout``. Returns
        what was running; the record is removed. ``spare_up``: the guard's call (``up`` is
        exiting; it may be waiting for the guard).
        """
        entries = {n: e for n, e in self.entries().items() if n != "guard" and e.alive()}
        if spare_up:
            entries.pop("up", None)
        for name in sorted(entries, key=NAMES.index):
            identity = entries[name]
            group = name != "up"  # the Dagster children lead their own process group
            if identity.alive():  # `up` may have stopped the others meanwhile
                _signal(identity.pid, signal.SIGTERM if name == "up" else signal.SIGINT, group)
                # `up` stops the whole stack in order before it exits: give it the longer wait.
                if not _wait_gone(identity, timeout * 3 if name == "up" else timeout):
                    log.warning(
                        "%s (pid %s) did not stop within %.0fs; killed", name, identity.pid, timeout
                    )
                    if identity.alive():
                        _signal(identity.pid, signal.SIGKILL, group)
                    _wait_gone(identity, 5.0)
            if group:  # what the leader left of its group: code servers, run workers
                _signal(identity.pid, signal.SIGKILL, group=True)
        self.remove()
        return {name: identity.pid for name, identity in entries.items()}


def _signal(pid: int, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(identity: Identity, timeout: float) -> bool:
    """Await the exit of the recorded process (a zombie, exited but not reaped, is gone)."""
    deadline = time.monotonic() + timeout
    while identity.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
