"""The definitions load and validate, the instance config ships intact, bad run config is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import (
    DagsterInvalidConfigError,
    DagsterRunStatus,
    Definitions,
    in_process_executor,
    validate_run_config,
)
from dagster._core.instance.config import dagster_instance_config

import reminder_pipeline
from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY
from reminder_pipeline.defs.jobs import CONCURRENCY_TAG, CONCURRENCY_VALUE
from reminder_pipeline.local import dagster_processes as orchestrator

REPO_ROOT = Path(reminder_pipeline.__file__).resolve().parent.parent
ROOT_INSTANCE_YAML = REPO_ROOT / "dagster.yaml"
SHIPPED_INSTANCE_YAML = REPO_ROOT / "reminder_pipeline" / "dagster_instance.yaml"
ROOT_WORKSPACE_YAML = REPO_ROOT / "workspace.yaml"
JOBS = ("reminder_dispatch", "reminder_catch_up")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resource settings present (EnvVar is resolved when a run config is resolved)."""
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


def test_definitions_load_and_validate_without_any_environment(monkeypatch):
    for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL"):
        monkeypatch.delenv(name, raising=False)
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= set(JOBS)
    assert repo.get_schedule_def("reminder_dispatch_schedule").job_name == "reminder_dispatch"
    assert DISPATCH_ASSET_KEY in defs.resolve_asset_graph().get_all_asset_keys()


def test_the_dispatch_job_has_the_four_steps_in_order_in_process_and_tagged():
    for name in JOBS:
        job = defs.get_job_def(name)
        assert job.executor_def is in_process_executor
        assert job.tags[CONCURRENCY_TAG] == CONCURRENCY_VALUE
        assert int(job.tags["dagster/max_runtime"]) < 300
        deps = job.graph.dependency_structure
        upstream = {
            name: sorted({o.node.name for o in deps.all_upstream_outputs_from_node(name)})
            for name in (
                "select_due_batch",
                "resolve_event_status",
                "transition_and_outbox",
                "relay_outbox",
            )
        }
        assert upstream == {
            "select_due_batch": [],
            "resolve_event_status": ["select_due_batch"],
            "transition_and_outbox": ["resolve_event_status"],
            "relay_outbox": ["transition_and_outbox"],
        }


def test_dagster_cli_validates_the_workspace(tmp_path):
    # Run outside the repo root, on an instance directory of its own (the root is checked below).
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")
    }
    env["DAGSTER_HOME"] = str(tmp_path)
    dagster = Path(sys.executable).with_name("dagster")
    done = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", str(ROOT_WORKSPACE_YAML)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Validation successful" in done.stdout + done.stderr


#: The front door: what a Dagster user runs from the root of a fresh clone, with nothing set.
FRONT_DOOR = (
    ("dg", "check", "defs"),
    ("dg", "list", "defs"),
    ("dagster", "definitions", "validate"),
)


@pytest.mark.parametrize("command", FRONT_DOOR, ids=" ".join)
def test_the_front_door_works_from_the_root_with_no_variable_set(tmp_path, command):
    # No DAGSTER_HOME, DATABASE_URL, DAGSTER_PG_URL, ...: only PATH and an empty HOME. The CLI then
    # makes a temporary instance under the root, configured by the root dagster.yaml.
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path)}
    executable = Path(sys.executable).with_name(command[0])
    done = subprocess.run(
        [str(executable), *command[1:]],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)}: {output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    if command[0] == "dagster":
        assert "Validation successful" in output
    elif command[1] == "check":
        assert "All definitions loaded successfully" in output
    else:
        assert "reminder_dispatch" in output


def test_the_root_instance_config_needs_no_variable_and_sends_nothing():
    # The temporary instance of the CLI run in the root: Dagster's default storage (in that
    # temporary directory), no telemetry; the deployed instance is the shipped one, not this.
    config = yaml.safe_load(ROOT_INSTANCE_YAML.read_text())
    assert config == {"telemetry": {"enabled": False}, "nux": {"enabled": False}}
    dagster_instance_config(str(ROOT_INSTANCE_YAML.parent), ROOT_INSTANCE_YAML.name)  # schema check


def test_the_shipped_instance_config_is_valid(monkeypatch):
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://dagster@127.0.0.1:5432/dagster")
    assert orchestrator.INSTANCE_YAML == SHIPPED_INSTANCE_YAML
    config = yaml.safe_load(SHIPPED_INSTANCE_YAML.read_text())
    dagster_instance_config(str(SHIPPED_INSTANCE_YAML.parent), SHIPPED_INSTANCE_YAML.name)
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
    assert config["concurrency"]["runs"]["tag_concurrency_limits"] == [
        {"key": CONCURRENCY_TAG, "value": CONCURRENCY_VALUE, "limit": 1},
        {"key": CONCURRENCY_TAG, "value": "republish", "limit": 1},  # reminder_republish
    ]
    # A queued dispatch starts within seconds of the one before ending, far inside the 2-minute
    # delivery promise (Dagster's default, 30 s, would eat half a cycle).
    assert 1 <= config["run_queue"]["dequeue_interval_seconds"] <= 5
    assert config["run_monitoring"]["enabled"] is True
    assert config["telemetry"]["enabled"] is False
    # The ops write the event log themselves (public context.log); python_logs would duplicate it.
    assert "python_logs" not in config
    assert orchestrator.WORKSPACE_YAML.read_bytes() == ROOT_WORKSPACE_YAML.read_bytes()


@pytest.mark.usefixtures("env")
def test_defaults_and_a_valid_config_are_accepted():
    ops = validate_run_config(defs.get_job_def("reminder_dispatch"), {})["ops"]
    assert ops["select_due_batch"]["config"] == {
        "batch_size": 200,
        "max_batches": 10_000,  # drains what is due, batch by batch, within the budget
        "budget_seconds": 30.0,
        "as_of": None,
    }
    ops = validate_run_config(defs.get_job_def("reminder_catch_up"), {})["ops"]
    assert ops["select_due_batch"]["config"]["max_batches"] == 10_000
    assert ops["select_due_batch"]["config"]["budget_seconds"] == 240.0
    ops = validate_run_config(
        defs.get_job_def("reminder_dispatch"),
        {
            "batch_size": 10_000,
            "max_batches": 5,
            "budget_seconds": 90,
            "as_of": "2026-01-01T10:00:00+03:00",
        },
    )["ops"]
    assert ops["select_due_batch"]["config"]["as_of"] == "2026-01-01T10:00:00+03:00"


@pytest.mark.usefixtures("env")
def test_the_run_config_leaves_the_future_to_the_database_clock():
    # Its form is checked at launch; "not after now" when the run starts, on the database's
    # clock (defs/test_job.py): the host creating the run may be off either way.
    validate_run_config(defs.get_job_def("reminder_dispatch"), {"as_of": "2999-01-01T00:00:00Z"})


@pytest.mark.parametrize(
    ("job", "run_config", "message"),
    [
        # The same bounds and lines as the CLI and the environment (config.check_*).
        ("reminder_dispatch", {"batch_size": 0}, "batch_size=0 is out of range [1, 10000]"),
        (
            "reminder_dispatch",
            {"batch_size": 10_001},
            "batch_size=10001 is out of range [1, 10000]",
        ),
        ("reminder_dispatch", {"max_batches": 0}, "max_batches=0 is out of range [1, 10000]"),
        ("reminder_dispatch", {"budget_seconds": 91}, "budget_seconds=91 is out of range [1, 90]"),
        (
            "reminder_catch_up",
            {"budget_seconds": 241},
            "budget_seconds=241 is out of range [1, 240]",
        ),
        (
            "reminder_dispatch",
            {"budget_seconds": float("nan")},
            "budget_seconds=nan is not a finite number",
        ),
        (
            "reminder_dispatch",
            {"as_of": "yesterday"},
            "as_of='yesterday' is not an ISO-8601 timestamp",
        ),
        (
            "reminder_dispatch",
            {"as_of": "2020-01-01T00:00:00"},
            "as_of='2020-01-01T00:00:00' has no time zone",
        ),
    ],
)
def test_a_bad_value_is_refused_with_a_one_line_message(job, run_config, message):
    with pytest.raises(DagsterInvalidConfigError) as error:
        validate_run_config(defs.get_job_def(job), run_config)
    text = str(error.value)
    assert text.startswith(f"{job} run config refused: ")
    assert message in text
    assert "\n" not in text


@pytest.mark.usefixtures("env")
def test_a_wrong_type_is_refused_by_the_schema():
    with pytest.raises(DagsterInvalidConfigError, match='Value "many"'):
        validate_run_config(defs.get_job_def("reminder_dispatch"), {"batch_size": "many"})


def test_in_flight_statuses_cover_the_queue():
    from reminder_pipeline.defs.schedules import IN_FLIGHT_STATUSES

    assert DagsterRunStatus.QUEUED in IN_FLIGHT_STATUSES
    assert DagsterRunStatus.SUCCESS not in IN_FLIGHT_STATUSES
