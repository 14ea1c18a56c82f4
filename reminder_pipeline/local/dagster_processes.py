"""Run Dagster for real: a prepared ``DAGSTER_HOME``, a code server, ``dagster-webserver`` and
``dagster-daemon``.

Used by ``reminder-pipeline up`` and by the end-to-end tests. Plain functions and one class, no
Dagster import (starting the CLI stays fast; Dagster runs in the children).

One code server for both (``dagster code-server start``, the workspace names it as a
``grpc_server``), not one each started by the daemon and the webserver from a ``python_module``
workspace: the daemon drops the code servers it started every 60 s and starts a new one
(``RELOAD_WORKSPACE_INTERVAL`` and ``clear_all_grpc_endpoints`` in Dagster's
``_daemon/controller.py``, no setting changes either), the old one shutting itself down 20 s later
("No heartbeat received in 20 seconds, shutting down" in the daemon's log): a new Python loading
the definitions every minute, about 5 % of a core on an idle stack. With a ``grpc_server`` entry
that refresh only reconnects. ``code-server start`` (not ``api grpc``) keeps the UI's "Reload"
working: it restarts its ``api grpc`` child with the code as it is now. Runs are launched by that
child (the default run launcher), so their workers are in the code server's process group.

Signals: a process started in the background by a shell inherits SIGINT *ignored*, and Dagster
maps SIGTERM onto SIGINT, so such a child would ignore both. The children here get both signals
reset to their defaults before exec and their own session (so a Ctrl-C in the terminal reaches
only the parent, which then stops them in order: daemon first so no new run is launched, then the
webserver, then the code server). Whatever survives the grace period is killed with its whole
process group (the code server's child, a run worker mid-run: its transaction rolls back, and run
monitoring fails that run).

However the parent ends, the children go too (a signal handler alone does not do it: SIGKILL,
SIGHUP with no handler, an EPIPE on a closed stdout end the parent before it stops anything):

- on Linux each child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``),
  which Dagster handles as SIGINT: a clean stop, the code server's child with it;
- everywhere, ``up`` starts a guard
  (``python -m reminder_pipeline.local.dagster_processes --guard``) in a session of its own
  that holds the read end of a pipe only ``up`` writes to: EOF means ``up``
  is gone, and the guard stops what the stack record (``up.json`` in the project home) names:
  the process groups of the daemon, webserver and code server (its child, run workers), then the
  embedded servers. ``up`` removes the record once it has stopped everything itself.

The record also lets a later ``up``, and ``services stop`` / ``status``, find what runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..config import DEFAULT_WEBSERVER_PORT, mask_secrets
from ..store.engine import create_database, dagster_storage_url
from .processes import free_port
from .stack_record import StackRecord

# Named, not __name__: the guard runs this module as __main__.
log = logging.getLogger("reminder_pipeline.local.dagster_processes")

#: The instance config shipped in the package (its only copy; the image copies it too).
INSTANCE_YAML = Path(__file__).parents[1] / "dagster_instance.yaml"
#: The workspace shipped in the package; identical to the repository's root workspace.yaml.
WORKSPACE_YAML = Path(__file__).parents[1] / "dagster_workspace.yaml"
LOCATION_NAME = "reminder_pipeline"
#: What the code server loads (the module and attribute the shipped workspace names).
DEFINITIONS_MODULE, DEFINITIONS_ATTRIBUTE = "reminder_pipeline.definitions", "defs"
#: Where the code server listens: this machine only.
CODE_SERVER_HOST = "127.0.0.1"
REQUIRED_ENV = ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL")
#: Where the webserver's and daemon's output goes, under DAGSTER_HOME. Never "logs": Dagster's
#: webserver and daemon treat $DAGSTER_HOME/logs/ as their telemetry spool and upload whatever is
#: in it to telemetry.dagster.io (an upload thread that ignores ``telemetry.enabled: false``).
PROCESS_LOG_DIR = "process-logs"
_POLL_SECONDS = 0.25


class OrchestratorError(RuntimeError):
    """The Dagster stack could not be prepared or started; the message is one line."""


def ensure_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``admin_url`` if missing; its Dagster URL."""
    create_database(admin_url, name)
    return dagster_storage_url(admin_url, database=name)


def prepare_home(
    home: Path,
    instance_yaml: Path | None = None,
    *,
    code_server_port: int | None = None,
    pooled_storage: bool = False,
) -> Path:
    """Create ``home`` with the instance config (``dagster.yaml``) and ``workspace.yaml``.

    The workspace is the shipped one (the code location as a ``python_module``), or with
    ``code_server_port`` the same location served by the code server on that port. The instance
    config is a copy of the shipped one, or with ``pooled_storage`` the same with Dagster's
    storage on pooled connections (:func:`pooled_instance_config`).
    """
    home = Path(home).expanduser().resolve()
    source = Path(instance_yaml) if instance_yaml is not None else INSTANCE_YAML
    if not source.is_file():
        raise OrchestratorError(f"Dagster instance config not found: {source}")
    home.mkdir(parents=True, exist_ok=True)
    (home / PROCESS_LOG_DIR).mkdir(exist_ok=True)
    # Overwritten every time: the shipped config is the source of truth (an upgrade changes it).
    if pooled_storage:
        (home / "dagster.yaml").write_text(pooled_instance_config(source.read_text()))
    else:
        shutil.copyfile(source, home / "dagster.yaml")
    if code_server_port is None:
        shutil.copyfile(WORKSPACE_YAML, home / "workspace.yaml")
    else:
        (home / "workspace.yaml").write_text(code_server_workspace(code_server_port))
    return home


#: The instance config's block naming Dagster's storage, as the shipped config writes it.
SHIPPED_STORAGE_BLOCK = """storage:
  postgres:
    postgres_url:
      env: DAGSTER_PG_URL
"""
#: Where the pooled storages live (reminder_pipeline/defs/pooled_storage.py); by name only: this
#: module imports no Dagster.
POOLED_STORAGE_MODULE = "reminder_pipeline.defs.pooled_storage"
POOLED_STORAGE_CLASSES = {
    "run_storage": "PooledPostgresRunStorage",
    "event_log_storage": "PooledPostgresEventLogStorage",
    "schedule_storage": "PooledPostgresScheduleStorage",
}


def pooled_instance_config(shipped: str) -> str:
    """The instance config ``shipped`` with its storage block replaced by the same PostgreSQL
    storages on pooled connections, one key each (JSON is YAML).

    What ``up`` runs: dagster-postgres otherwise opens a new connection for each storage call
    (about 420 a minute on an idle stack, ~3 % of a core in PostgreSQL alone); the pooled
    classes keep them as ``dagster-webserver`` does (``reminder_pipeline/defs/pooled_storage.py``).
    """
    if shipped.count(SHIPPED_STORAGE_BLOCK) != 1:
        raise OrchestratorError("the instance config has no storage block to pool")
    url = {"postgres_url": {"env": "DAGSTER_PG_URL"}}
    pooled = "".join(
        f"{key}: {json.dumps({'module': POOLED_STORAGE_MODULE, 'class': name, 'config': url})}\n"
        for key, name in POOLED_STORAGE_CLASSES.items()
    )
    header = (
        "# Written by reminder-pipeline up: the shipped instance config (reminder_pipeline/\n"
        "# dagster_instance.yaml) with Dagster's storage on pooled connections.\n"
    )
    return header + shipped.replace(SHIPPED_STORAGE_BLOCK, pooled)


def code_server_workspace(port: int) -> str:
    """The workspace whose one code location is the code server on ``port`` (JSON is YAML)."""
    entry = {"host": CODE_SERVER_HOST, "port": port, "location_name": LOCATION_NAME}
    return (
        "# Written by reminder-pipeline up: the code server it started (dagster code-server start)."
        f"\n{json.dumps({'load_from': [{'grpc_server': entry}]}, indent=2)}\n"
    )


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), looked up once here: never between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


_PRCTL = _load_prctl()


def _child_setup(parent: int) -> Callable[[], None]:
    """What a child runs between fork and exec: default signals, SIGTERM when ``parent`` dies."""

    def setup() -> None:
        # No import, no allocation-heavy call: safe after a fork in a threaded parent.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the request took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


def _command(script: str) -> list[str]:
    """The console script next to this interpreter (same venv), else the one on PATH."""
    candidate = Path(sys.executable).with_name(script)
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return [str(candidate)]
    found = shutil.which(script)
    if found is None:
        raise OrchestratorError(f"{script} not found next to {sys.executable} nor on PATH")
    return [found]


def log_tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a log file on one line (for one-line errors)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    # Dagster's own errors may quote its storage URL: never print a password.
    return mask_secrets(" | ".join(" ".join(line.split()) for line in text[-lines:]))[-600:]


class DagsterStack:
    """A code server, ``dagster-webserver`` and ``dagster-daemon run`` on one ``DAGSTER_HOME``."""

    def __init__(
        self,
        home: Path,
        env: Mapping[str, str],
        host: str = "127.0.0.1",
        port: int = DEFAULT_WEBSERVER_PORT,
        *,
        instance_yaml: Path | None = None,
        log_level: str = "info",
        record: StackRecord | None = None,
        pooled_storage: bool = False,
    ) -> None:
        self.home = Path(home).expanduser().resolve()
        self.record = record
        self.pooled_storage = pooled_storage
        self.env = dict(env)
        self.host = host
        self.port = port
        self.instance_yaml = instance_yaml
        self.log_level = log_level
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}

    @property
    def url(self) -> str:
        """The UI's address."""
        return f"http://{self.host}:{self.port}"

    def log_file(self, name: str) -> Path:
        """Where ``code_server`` / ``webserver`` / ``daemon`` write their output."""
        return self.home / PROCESS_LOG_DIR / f"{name}.log"

    def child_env(self) -> dict[str, str]:
        """The children's environment: ours, the settings, ``DAGSTER_HOME``; storage on psycopg2."""
        env = {**os.environ, **self.env}
        missing = [name for name in REQUIRED_ENV if not env.get(name)]
        if missing:
            raise OrchestratorError(f"{', '.join(missing)} not set for the Dagster stack")
        env["DAGSTER_PG_URL"] = dagster_storage_url(env["DAGSTER_PG_URL"])
        env["DAGSTER_HOME"] = str(self.home)
        # The only switch that stops the telemetry upload thread (see PROCESS_LOG_DIR).
        env["DAGSTER_DISABLE_TELEMETRY"] = "1"
        return env

    def start(
        self, timeout: float = 180.0, progress: Callable[[str], object] | None = None
    ) -> None:
        """Prepare the home, start the code server, then the daemon and webserver; wait until the
        UI serves the code.

        ``progress`` is called with a status line on every poll while waiting (the caller
        decides how often to show it; see :class:`reminder_pipeline.cli.ProgressLine`).
        """
        if self._procs:
            raise OrchestratorError("the Dagster stack is already started")
        env = self.child_env()
        if _answers(f"{self.url}/server_info"):
            raise OrchestratorError(
                f"something already answers on {self.url} (not a Dagster of this home: "
                "`reminder-pipeline services status` lists those); stop it or choose another port "
                "(DAGSTER_WEBSERVER_PORT)"
            )
        code_port = free_port()
        prepare_home(
            self.home,
            self.instance_yaml,
            code_server_port=code_port,
            pooled_storage=self.pooled_storage,
        )
        workspace = str(self.home / "workspace.yaml")
        started = time.monotonic()
        try:
            self._spawn(
                "code_server",
                [
                    *_command("dagster"),
                    "code-server",
                    "start",
                    "-m",
                    DEFINITIONS_MODULE,
                    "-a",
                    DEFINITIONS_ATTRIBUTE,
                    "--location-name",
                    LOCATION_NAME,
                    "-h",
                    CODE_SERVER_HOST,
                    "-p",
                    str(code_port),
                    "--log-level",
                    self.log_level,
                ],
                env,
            )
            self._wait_code_server(code_port, started + timeout, progress)
            self._spawn(
                "daemon",
                [
                    *_command("dagster-daemon"),
                    "run",
                    "-w",
                    workspace,
                    "--log-level",
                    self.log_level,
                ],
                env,
            )
            self._spawn(
                "webserver",
                [
                    *_command("dagster-webserver"),
                    "-w",
                    workspace,
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "--dagster-log-level",
                    self.log_level,
                ],
                env,
            )
            self.wait_ready(max(timeout - (time.monotonic() - started), 1.0), progress)
        except BaseException:
            self.stop()
            raise
        log.info("dagster started at %s (home %s)", self.url, self.home)

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        log_file = self.log_file(name).open("ab")
        self._logs[name] = log_file
        self._procs[name] = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid()),
        )
        if self.record is not None:
            self.record.add(name, self._procs[name].pid)

    def _wait_code_server(
        self, port: int, deadline: float, progress: Callable[[str], object] | None
    ) -> None:
        """Until the code server listens (once its ``api grpc`` child loaded the code)."""
        started = time.monotonic()
        while not _listens(CODE_SERVER_HOST, port):
            if progress is not None:
                progress(
                    f"waiting for Dagster: code server loading {LOCATION_NAME} "
                    f"({time.monotonic() - started:.0f} s)"
                )
            self._check_alive()
            if time.monotonic() > deadline:
                raise OrchestratorError(
                    f"dagster code server did not listen on port {port} in time: "
                    f"{log_tail(self.log_file('code_server'))}"
                )
            time.sleep(_POLL_SECONDS)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise OrchestratorError(
                    f"dagster {name} exited with code {proc.returncode}: "
                    f"{log_tail(self.log_file(name))}"
                )

    def wait_ready(
        self, timeout: float = 180.0, progress: Callable[[str], object] | None = None
    ) -> None:
        """Poll ``/server_info`` and then the code location's load status until both are good."""
        started = time.monotonic()
        deadline = started + timeout

        def report(phase: str) -> None:
            if progress is not None:
                progress(f"waiting for Dagster: {phase} ({time.monotonic() - started:.0f} s)")

        while not _answers(f"{self.url}/server_info"):
            report(f"webserver starting on {self.url}")
            self._check_alive()
            if time.monotonic() > deadline:
                raise OrchestratorError(
                    f"dagster webserver did not answer on {self.url} within {timeout:.0f}s"
                )
            time.sleep(_POLL_SECONDS)
        while True:
            self._check_alive()
            status, error = self.location_status()
            report(f"code location {LOCATION_NAME} {(status or 'not listed yet').lower()}")
            if status == "LOADED" and error is None:
                return
            if status == "LOADED" and error:
                raise OrchestratorError(f"code location {LOCATION_NAME} failed to load: {error}")
            if time.monotonic() > deadline:
                raise OrchestratorError(
                    f"code location {LOCATION_NAME} not loaded within {timeout:.0f}s "
                    f"(status {status})"
                )
            time.sleep(_POLL_SECONDS)

    def location_status(self) -> tuple[str | None, str | None]:
        """(load status, one-line load error) of the code location, from the webserver's GraphQL."""
        query = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name
            loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
        try:
            data = self.graphql(query)
        except (OSError, ValueError, OrchestratorError):  # not serving GraphQL yet
            return None, None
        entries = (data.get("workspaceOrError") or {}).get("locationEntries") or []
        for entry in entries:
            if entry.get("name") == LOCATION_NAME:
                loaded = entry.get("locationOrLoadError") or {}
                error = loaded.get("message") if loaded.get("__typename") == "PythonError" else None
                return entry.get("loadStatus"), None if error is None else " ".join(error.split())[
                    :400
                ]
        return None, None

    def graphql(
        self, query: str, variables: Mapping[str, object] | None = None, timeout: float = 15.0
    ) -> dict[str, Any]:
        """POST a GraphQL query to the webserver; its ``data``."""
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise OrchestratorError(f"GraphQL error: {payload['errors'][0].get('message')}")
        return payload.get("data") or {}

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the started children (``code_server``, ``daemon``, ``webserver``)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def is_running(self) -> bool:
        """True while all the children are alive."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT the daemon, the webserver, the code server (in that order: no new run is
        launched, a run going ends); SIGTERM, then SIGKILL their process groups."""
        for name in ("daemon", "webserver", "code_server"):
            proc = self._procs.get(name)
            if proc is not None:
                _stop_process(name, proc, timeout)
        for name, proc in self._procs.items():
            _kill_group(name, proc)
        self._procs.clear()
        for handle in self._logs.values():
            handle.close()
        self._logs.clear()

    def __enter__(self) -> DagsterStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listens(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop_process(name: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 5.0)):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            log.warning("dagster %s did not stop on %s within %.0fs", name, sig.name, wait)
    _kill_group(name, proc)
    proc.wait(5)


def _kill_group(name: str, proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of the child's own process group (it leads a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        # Routine after a clean stop (a code server the leader left): not news to whoever stops.
        log.debug("killed what was left of dagster %s's process group", name)
    except (ProcessLookupError, PermissionError):
        pass


# --- the guard of what `up` started (the record: stack_record.py) ------------------------------


def start_guard(home: Path, *, keep_servers: bool) -> subprocess.Popen[bytes]:
    """Start the guard of this process (``up``): it stops the recorded stack when we are gone.

    The guard reads a pipe whose write end only this process holds, so EOF means we exited,
    whatever way. The caller keeps the returned Popen (and its ``stdin``) for its lifetime.
    """
    home = Path(home).expanduser().resolve()
    (home / PROCESS_LOG_DIR).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "reminder_pipeline.local.dagster_processes", "--guard", str(home)]
    if keep_servers:
        argv.append("--keep-servers")
    with (home / PROCESS_LOG_DIR / "guard.log").open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # out of the terminal's reach: no SIGINT, no SIGHUP
        )


def guard(home: Path, *, keep_servers: bool, parent: IO[bytes]) -> int:
    """Wait for EOF on ``parent``; then stop what the record still names, and the servers."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the parent's end decides
    while parent.read(4096):
        pass
    record = StackRecord(home)
    if not record.exists():  # up stopped everything itself
        return 0
    from ..logs import configure, event

    configure()
    stopped = record.stop(spare_up=True)
    event(log, logging.WARNING, "up is gone: stopped what it left running", **stopped)
    if not keep_servers:
        from ..config import Settings
        from .endpoints import stop_servers

        stop_servers(Settings.from_env())
        event(log, logging.WARNING, "up is gone: stopped the embedded servers")
    return 0


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reminder_pipeline.local.dagster_processes")
    parser.add_argument("--guard", type=Path, required=True, metavar="HOME")
    parser.add_argument("--keep-servers", action="store_true")
    args = parser.parse_args(argv)
    return guard(args.guard, keep_servers=args.keep_servers, parent=sys.stdin.buffer)


if __name__ == "__main__":  # pragma: no cover - the guard's own process
    sys.exit(_main())
