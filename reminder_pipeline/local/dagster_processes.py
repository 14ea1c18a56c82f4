"""Run Dagster for real: a prepared ``DAGSTER_HOME``, ``dagster-webserver`` and ``dagster-daemon``.

Used by ``reminder-pipeline up`` and by the end-to-end tests. Plain functions and one class, no
Dagster import (starting the CLI stays fast; Dagster runs in the children).

Signals: a process started in the background by a shell inherits SIGINT *ignored*, and Dagster
maps SIGTERM onto SIGINT, so such a child would ignore both. The children here get both signals
reset to their defaults before exec and their own session (so a Ctrl-C in the terminal reaches
only the parent, which then stops them in order: daemon first so no new run is launched, then the
webserver). Whatever survives the grace period is killed with its whole process group (code
servers, a run worker mid-run: its transaction rolls back, and run monitoring fails that run).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from ..config import mask_secrets
from ..store.engine import create_database, dagster_storage_url

log = logging.getLogger(__name__)

#: The instance config shipped in the package; identical to the repository's root dagster.yaml.
INSTANCE_YAML = Path(__file__).parents[1] / "dagster_instance.yaml"
#: The workspace shipped in the package; identical to the repository's root workspace.yaml.
WORKSPACE_YAML = Path(__file__).parents[1] / "dagster_workspace.yaml"
LOCATION_NAME = "reminder_pipeline"
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


def prepare_home(home: Path, instance_yaml: Path | None = None) -> Path:
    """Create ``home`` with the instance config (``dagster.yaml``) and ``workspace.yaml``."""
    home = Path(home).expanduser().resolve()
    source = Path(instance_yaml) if instance_yaml is not None else INSTANCE_YAML
    if not source.is_file():
        raise OrchestratorError(f"Dagster instance config not found: {source}")
    home.mkdir(parents=True, exist_ok=True)
    (home / PROCESS_LOG_DIR).mkdir(exist_ok=True)
    # Overwritten every time: the shipped config is the source of truth (an upgrade changes it).
    shutil.copyfile(source, home / "dagster.yaml")
    shutil.copyfile(WORKSPACE_YAML, home / "workspace.yaml")
    return home


def _reset_signals() -> None:
    """Runs in the child between fork and exec: no import, no lock, so safe even with threads."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
    """``dagster-webserver`` and ``dagster-daemon run`` on one ``DAGSTER_HOME``."""

    def __init__(
        self,
        home: Path,
        env: Mapping[str, str],
        host: str = "127.0.0.1",
        port: int = 3000,
        *,
        instance_yaml: Path | None = None,
        log_level: str = "info",
    ) -> None:
        self.home = Path(home).expanduser().resolve()
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
        """Where ``webserver`` / ``daemon`` write their output."""
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
        """Prepare the home, start the daemon and webserver, wait until the UI serves the code.

        ``progress`` is called with a status line on every poll while waiting (the caller
        decides how often to show it; see :class:`reminder_pipeline.cli.ProgressLine`).
        """
        if self._procs:
            raise OrchestratorError("the Dagster stack is already started")
        env = self.child_env()
        if _answers(f"{self.url}/server_info"):
            raise OrchestratorError(f"something already answers on {self.url}; choose another port")
        prepare_home(self.home, self.instance_yaml)
        workspace = str(self.home / "workspace.yaml")
        try:
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
            self.wait_ready(timeout, progress)
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
            preexec_fn=_reset_signals,
        )

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
    ) -> dict:
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
        """Process ids of the started children (``daemon``, ``webserver``)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def is_running(self) -> bool:
        """True while both children are alive."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT the daemon, then the webserver; SIGTERM, then SIGKILL their process groups."""
        for name in ("daemon", "webserver"):
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


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
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
        log.info("killed what was left of dagster %s's process group", name)
    except (ProcessLookupError, PermissionError):
        pass
