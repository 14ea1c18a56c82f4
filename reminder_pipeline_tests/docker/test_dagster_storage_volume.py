"""DAGSTER_HOME's storage on a named volume in docker/compose.yaml, checked without a Docker engine.

What re-execution from the UI needs (the step outputs of the runs before it) and the compute
logs the UI shows live in ``$DAGSTER_HOME/storage``. The compose file must put that directory
on a named volume shared by every Dagster process (the user-code server whose run workers write
it, the webserver and the daemon), so a re-created container keeps it; the image must create
the directory owned by the user it runs as (a new volume takes the image directory's owner);
and the shipped instance config must keep step outputs and compute logs in that directory.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import FilesystemIOManager, instance_for_test, job, op

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTANCE_YAML = ROOT / "reminder_pipeline" / "dagster_instance.yaml"
VOLUME = "dagster-storage"
DAGSTER_SERVICES = ("user-code", "webserver", "daemon")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the <<: *app-env merges


def _mounts(service: dict) -> dict[str, tuple[str, str]]:
    """target → (source, mode) of a service's short-syntax volume entries."""
    mounts = {}
    for entry in service.get("volumes") or []:
        source, target, *mode = str(entry).split(":")
        mounts[target] = (source, mode[0] if mode else "rw")
    return mounts


def test_every_dagster_process_mounts_the_storage_volume_at_dagster_home_storage():
    compose = _compose()
    assert VOLUME in (compose.get("volumes") or {}), f"top-level volume {VOLUME} not declared"
    for name in DAGSTER_SERVICES:
        service = compose["services"][name]
        home = service["environment"]["DAGSTER_HOME"]
        mounts = _mounts(service)
        target = f"{home.rstrip('/')}/storage"
        assert target in mounts, f"{name}: nothing mounted at {target}: {mounts}"
        assert mounts[target] == (VOLUME, "rw"), f"{name}: {target} is {mounts[target]}"


def test_no_other_dagster_process_runs_without_the_volume():
    # A new Dagster service (a second code location, a run worker service) must share it too.
    for name, service in _compose()["services"].items():
        command = service.get("command") or []
        runs_dagster = bool(command) and str(command[0]).startswith("dagster")
        if runs_dagster:
            assert name in DAGSTER_SERVICES, f"{name} runs {command[0]} and is not checked here"


def test_the_image_creates_the_storage_directory_owned_by_its_user():
    text = DOCKERFILE.read_text()
    lines = [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines()]
    env_home = next(line for line in lines if line.startswith("ENV ") and "DAGSTER_HOME=" in line)
    home = env_home.split("DAGSTER_HOME=")[1].split()[0]
    assert home == _compose()["services"]["user-code"]["environment"]["DAGSTER_HOME"]
    [user] = [line.split()[1] for line in lines if line.startswith("USER ")]
    run = " ".join(line for line in lines if line.startswith("RUN "))
    assert 'mkdir -p "$DAGSTER_HOME/storage"' in run
    assert f'chown -R {user} "$DAGSTER_HOME"' in run


@op
def _output() -> int:
    print("a compute log line")  # captured into the run's compute logs
    return 1


@job(resource_defs={"io_manager": FilesystemIOManager()})
def _one_step():
    _output()


def test_the_shipped_instance_keeps_step_outputs_and_compute_logs_under_dagster_home_storage(
    tmp_path,
):
    shipped = yaml.safe_load(INSTANCE_YAML.read_text())
    # Moving either elsewhere would leave it outside the volume.
    assert not {"local_artifact_storage", "compute_logs"} & set(shipped)
    overrides = {key: value for key, value in shipped.items() if key != "storage"}  # no server here
    home = tmp_path / "dagster_home"
    home.mkdir()
    with instance_for_test(temp_dir=str(home), overrides=overrides) as instance:
        assert Path(instance.storage_directory()) == home / "storage"
        run_id = _one_step.execute_in_process(instance=instance).run_id
    run_dir = home / "storage" / run_id
    assert (run_dir / "_output" / "result").is_file()
    assert any(run_dir.glob("compute_logs/*.out"))
