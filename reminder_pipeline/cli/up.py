"""``up`` and its runner: everything on the embedded default, until Ctrl-C, SIGTERM or SIGHUP.

The quick start (the ``embedded`` extra): servers, schema, topic, demo data, a first cycle, then
Dagster's webserver and daemon, the exporter and the demo feeder; however it ends, what it started
stops (a guard process stops the rest if ``up`` itself cannot).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .. import logs
from .context import (
    StopRequest,
    load_settings,
    open_publisher,
    open_servers,
    progress_line,
    stop_requests,
)
from .exits import EXIT_OK
from .metrics import heartbeat_reader
from .options import flag
from .output import PROG, command_as_started, psql_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Settings
    from ..local.endpoints import Endpoints
    from ..local.stack_record import StackRecord

log = logging.getLogger("reminder_pipeline.cli")

#: ``up``'s JSON log, under its home (made at its first line).
LOG_FILE = Path("logs") / "up.log"
#: What names the Dagster instance ``up`` runs (its home and its storage).
INSTANCE_ENV = ("DAGSTER_HOME", "DAGSTER_PG_URL")


@click.command()
@flag("--once", envvar="REMINDER_UP_ONCE", help="Stop after the first cycle (no Dagster).")
@flag("--no-demo", envvar="REMINDER_UP_NO_DEMO", help="Neither seed nor feed demo data.")
@flag(
    "--keep-servers",
    envvar="REMINDER_UP_KEEP_SERVERS",
    help="Leave PostgreSQL and the broker running on exit.",
)
def up(once: bool, no_demo: bool, keep_servers: bool) -> int:
    """Everything on the embedded default: servers, schema, topic, demo data, a cycle, Dagster.

    The quick start (the `embedded` extra): the one command besides `db upgrade` that migrates.
    """
    from ..local.dagster_processes import start_guard
    from ..local.endpoints import require_embedded
    from ..local.stack_record import StackRecord

    require_embedded()
    settings = load_settings()
    _log_to_file(settings)
    # From here on a SIGINT, SIGTERM or SIGHUP is never lost: during the start it interrupts
    # (exit 130, what was started stopped), once everything runs it is the clean stop.
    with stop_requests(signal.SIGHUP) as request:
        record = _take_over(StackRecord(settings.home))
        # The guard stops what this `up` started if it ends without doing so (SIGKILL, ...).
        guard = start_guard(settings.home, keep_servers=keep_servers or once)
        try:
            record.add("up", os.getpid())
            record.add("guard", guard.pid)
            return _up(
                settings, record, request, once=once, demo=not no_demo, keep_servers=keep_servers
            )
        finally:
            request.interrupting = False  # a second signal must not cut the stop short
            if guard.stdin is not None:
                guard.stdin.close()  # EOF: the guard acts only if the record is still there
            # It may still be stopping leftovers after that; it finishes alone.
            with suppress(subprocess.TimeoutExpired):
                guard.wait(30)


def _take_over(record: StackRecord) -> StackRecord:
    """Refuse to start beside a running ``up`` of the same home; stop what a dead one left."""
    from ..local.dagster_processes import OrchestratorError

    running = record.running()
    if "up" in running:
        raise OrchestratorError(
            f"reminder-pipeline up already runs under {record.path.parent} ({record.describe()}); "
            f"stop it with `{command_as_started()} services stop`"
        )
    if running:
        what = record.describe()
        record.stop()
        _say(f"stopped what an earlier up left running: {what}")
    record.remove()
    return record


def _log_to_file(settings: Settings) -> None:
    """``up``'s JSON log goes to its file (at ``--log-level``, by default INFO): the terminal
    keeps ``up``'s own lines, and a line for each warning or error."""
    chosen = (click.get_current_context().find_root().obj or {}).get("log_level")
    logs.to_file(settings.home / LOG_FILE, chosen or logging.INFO, prefix=PROG)


def _say(text: str) -> None:
    """Print a status line; a closed stdout (``up | tee`` after Ctrl-C) must not stop the stop."""
    try:
        print(text, flush=True)
    except OSError:  # EPIPE: nobody reads; send the rest of our output nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _up(
    settings: Settings,
    record: StackRecord,
    request: StopRequest,
    *,
    once: bool,
    demo: bool,
    keep_servers: bool,
) -> int:
    """``up``'s work, once the guard is there; ``request`` is checked between its steps."""
    from .. import cycle
    from ..local import demo as demo_data
    from ..store import migrate

    _say(f"reminder-pipeline: starting under {settings.home}")
    _say(f"Log: {settings.home / LOG_FILE}  (JSON lines; a warning or an error also here)")
    # A signal is seen at the checkpoints (request.check()); it raises at once only in the
    # database work, where each step is a transaction. Not while a process is spawned: a
    # KeyboardInterrupt inside Popen, or before its pid is written down, loses that process.
    endpoints, engine = open_servers(settings, broker=True)
    request.check()
    request.interrupting = True
    migrate.upgrade(engine)
    publisher = open_publisher(settings, endpoints.bootstrap_servers)
    if demo:
        # A few reminders due now for the first cycle; the feeder lays out the coming minutes
        # once Dagster runs, so none falls due (and late) while it loads.
        demo_data.seed(engine, upcoming=0)
    report = cycle.run_cycle(
        engine, publisher, batch_size=settings.batch_size, writer=cycle.cli_writer("up")
    )
    publisher.close()
    request.interrupting = False
    request.check()
    counts = report.as_dict()
    _say(
        "first dispatch cycle: sent={sent} skipped={skipped} skipped_locked={skipped_locked} "
        "failed={failed} published={published} duration_ms={duration_ms} "
        "backlog_remaining={backlog_remaining}".format(**counts)
    )
    if once:
        engine.dispose()
        record.remove()  # the servers stay up by design; nothing else was started
        return EXIT_OK
    return _run_dagster(
        settings,
        endpoints,
        engine,
        record=record,
        request=request,
        demo=demo,
        keep_servers=keep_servers,
    )


def docs_served_here(metrics_port: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The runbook links of the Dagster UI ``up`` runs point at this checkout's docs as served
    by the metrics exporter (``http://…:PORT/docs/``, links a browser opens), unless
    REMINDER_DOCS_BASE_URL is set or there are no docs here (an installed wheel)."""
    from ..config import DOCS_BASE_URL_ENV, DOCS_DIR

    if environ.get(DOCS_BASE_URL_ENV, "").strip() or not DOCS_DIR.is_dir():
        return {}
    host = environ.get("REMINDER_METRICS_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):  # listening everywhere: this host's own address opens it
        host = "127.0.0.1"
    return {DOCS_BASE_URL_ENV: f"http://{host}:{metrics_port}/docs/"}


def _print_ready(ui_url: str, metrics_url: str, database_url: str) -> None:
    """Where everything is, and hints that run as printed from where the user is."""
    command = command_as_started()
    database = psql_url(database_url)
    # Line by line through _say: a reader that stops after the first line (unbuffered output)
    # and closes the pipe must not turn the later lines into an exit 1.
    _say(f"Dagster UI: {ui_url}  (schedule reminder_dispatch_schedule runs every minute)")
    _say(f"Prometheus metrics: {metrics_url}")
    _say(f"Database: {database}  ({command} services status)")
    _say(f"Watch reminders arrive: {command} consume   |   Ctrl-C stops everything")


def _run_dagster(
    settings: Settings,
    endpoints: Endpoints,
    engine: Engine,
    *,
    record: StackRecord,
    request: StopRequest,
    demo: bool,
    keep_servers: bool,
) -> int:
    """Dagster webserver + daemon, the exporter and the demo feeder until stopped; then stop all.

    Stopped by Ctrl-C (SIGINT), SIGTERM or the terminal's SIGHUP. Each step of the stop runs
    even if one before failed; the record is removed only when all of them succeeded (else the
    guard stops the rest when we exit).
    """
    from ..local import demo as demo_data
    from ..local.dagster_processes import DagsterStack
    from ..local.endpoints import stop_servers
    from ..observability.exporter import start_exporter

    env = {
        **os.environ,
        **endpoints.env(),
        "REMINDER_PIPELINE_HOME": str(settings.home),
        **docs_served_here(settings.metrics_port, os.environ),
    }
    # Dagster's storage on pooled connections: the local stack's largest cost otherwise.
    stack = DagsterStack(
        home=settings.home / "dagster_home",
        env=env,
        port=settings.webserver_port,
        record=record,
        pooled_storage=True,
    )
    feeder = demo_data.DemoFeeder(engine) if demo else None
    exporter = None
    line = progress_line()

    def progress(text: str) -> None:
        request.check()  # every poll of the wait for Dagster is a checkpoint
        line.tick(text)

    try:
        # A signal before the last checkpoint interrupts the start (exit 130), after it it is
        # the clean stop (exit 0); either way everything started is stopped below.
        stack.start(progress=progress)
        request.check()
        # The exporter reads the daemons' heartbeats from the instance the stack runs on.
        os.environ.update({k: v for k, v in stack.child_env().items() if k in INSTANCE_ENV})
        exporter = start_exporter(settings, endpoints, heartbeats=heartbeat_reader(os.environ))
        if feeder:
            feeder.start()
        request.check()
        _print_ready(stack.url, exporter.url, endpoints.database_url)
        request.wait()
    finally:
        _say("stopping...")
        # One line per part stopped, in order; each step runs even if one before failed.
        steps: list[tuple[str | None, Callable[[], object]]] = []
        if feeder:
            steps.append(("demo feeder", feeder.stop))
        if exporter is not None:
            steps.append(("metrics exporter", exporter.stop))
        steps += [("Dagster daemon and webserver", stack.stop), (None, engine.dispose)]
        if not keep_servers:
            steps.append(("embedded broker and PostgreSQL", lambda: stop_servers(settings)))
        failed = 0
        for name, step in steps:
            try:
                step()
            except Exception:  # the next steps still run; the guard gets what is left
                log.exception("stopping up: a step failed")
                failed += 1
            else:
                if name:
                    _say(f"stopped {name}")
        if not failed:
            record.remove()
        _say("stopped")
    return EXIT_OK
