"""The orchestrator's plain parts: the prepared DAGSTER_HOME, the children's environment and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.store import engine as db


def _without_query(url: str) -> str:
    """The URL up to its query (dagster_storage_url adds the connection bounds there)."""
    return url.split("?", 1)[0]


def test_storage_urls_are_moved_to_psycopg2():
    url = db.dagster_storage_url("postgresql+psycopg://u:p@h:5/app", database="dagster")
    assert _without_query(url) == "postgresql+psycopg2://u:p@h:5/dagster"
    assert "tcp_user_timeout=" in url
    assert _without_query(db.dagster_storage_url("postgresql://u@h/db")) == (
        "postgresql+psycopg2://u@h/db"
    )


def test_prepare_home_copies_the_instance_config_and_writes_the_workspace(tmp_path: Path):
    home = orchestrator.prepare_home(tmp_path / "home")

    assert (home / "dagster.yaml").read_bytes() == orchestrator.INSTANCE_YAML.read_bytes()
    workspace = yaml.safe_load((home / "workspace.yaml").read_text())
    assert (
        workspace["load_from"][0]["python_module"]["module_name"] == "reminder_pipeline.definitions"
    )
    # Never $DAGSTER_HOME/logs: Dagster uploads that directory as telemetry.
    assert orchestrator.PROCESS_LOG_DIR != "logs" and not (home / "logs").exists()


def test_with_a_code_server_the_workspace_names_it_and_no_module(tmp_path: Path):
    # The daemon and the webserver then share the code server `up` starts: the daemon's
    # workspace refresh (every 60 s) reconnects instead of starting a new code server.
    home = orchestrator.prepare_home(tmp_path / "home", code_server_port=4321)

    [entry] = yaml.safe_load((home / "workspace.yaml").read_text())["load_from"]
    assert entry == {
        "grpc_server": {
            "host": orchestrator.CODE_SERVER_HOST,
            "port": 4321,
            "location_name": orchestrator.LOCATION_NAME,
        }
    }


def test_child_env_requires_the_settings_and_disables_telemetry_uploads(
    tmp_path: Path, monkeypatch
):
    for name in orchestrator.REQUIRED_ENV:
        monkeypatch.delenv(name, raising=False)
    stack = orchestrator.DagsterStack(tmp_path, {"DATABASE_URL": "postgresql+psycopg://u@h/app"})
    with pytest.raises(
        orchestrator.OrchestratorError, match="KAFKA_BOOTSTRAP_SERVERS, DAGSTER_PG_URL not set"
    ):
        stack.child_env()

    stack = orchestrator.DagsterStack(
        tmp_path,
        {
            "DATABASE_URL": "postgresql+psycopg://u@h/app",
            "KAFKA_BOOTSTRAP_SERVERS": "h:9092",
            "DAGSTER_PG_URL": "postgresql+psycopg://u@h/dagster",
        },
        port=3123,
    )
    env = stack.child_env()
    assert _without_query(env["DAGSTER_PG_URL"]) == "postgresql+psycopg2://u@h/dagster"
    assert env["DAGSTER_HOME"] == str(tmp_path.resolve())
    assert env["DAGSTER_DISABLE_TELEMETRY"] == "1"
    assert stack.url == "http://127.0.0.1:3123"


def test_children_get_default_signal_handlers_even_when_the_parent_ignores_sigint():
    # What a shell does to a background job; Python then leaves SIGINT ignored in its children.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        probe = (
            "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
        )
        plain = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
        reset = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=orchestrator._child_setup(os.getpid()),
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert plain.stdout.strip() == "False"
    assert reset.stdout.strip() == "True"


def test_a_stopped_stack_is_not_running_and_stop_is_idempotent(tmp_path: Path):
    stack = orchestrator.DagsterStack(tmp_path, {})
    assert not stack.is_running()
    stack.stop()
    stack.stop()
