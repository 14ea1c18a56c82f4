"""The Kubernetes layout (docker/helm/values.yaml for Dagster's official Helm chart), checked as text.

No cluster and no ``helm`` binary run here, so the values are checked as far as text allows: they
parse and use the chart's own keys; the run launcher is ``K8sRunLauncher``; the user-code
deployment runs the image docker/Dockerfile builds and loads a module and attribute that exist;
every environment variable the code reads is set for the code's processes (the code location,
its run pods, the migration Job and the exporter); Dagster's storage is its own PostgreSQL
database; and the instance settings are those of the shipped dagster_instance.yaml. The dispatch
schedule is evaluated on an instance configured the way the chart renders these values, so the
concurrency limit written here is the one the schedule follows.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from dagster import Definitions, build_schedule_context, instance_for_test

from reminder_pipeline.cli import cli
from reminder_pipeline.config import Settings
from reminder_pipeline.defs.jobs import CONCURRENCY_TAG, CONCURRENCY_VALUE
from reminder_pipeline.defs.schedules import dispatch_concurrency_limit
from reminder_pipeline_tests.docker.test_docker_files import (
    dockerfile_instructions,
    env_vars_read_by_the_code,
)

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "docker" / "helm" / "values.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"

#: Top-level keys of the dagster chart's values (its values.yaml and schema); anything else would
#: be ignored by ``helm install`` without a word.
CHART_KEYS = {
    "global",
    "nameOverride",
    "fullnameOverride",
    "rbacEnabled",
    "imagePullSecrets",
    "dagsterWebserver",
    "computeLogManager",
    "pythonLogs",
    "dagster-user-deployments",
    "scheduler",
    "runLauncher",
    "postgresql",
    "generatePostgresqlPasswordSecret",
    "generateCeleryConfigSecret",
    "rabbitmq",
    "redis",
    "flower",
    "ingress",
    "dagsterDaemon",
    "busybox",
    "extraManifests",
    "migrate",
    "telemetry",
    "serviceAccount",
    "retention",
    "additionalInstanceConfig",
    "concurrency",
}

#: Read by the code but not set for the Kubernetes processes, each with the reason.
NOT_KUBERNETES_SETTINGS = {
    "USER": "who ran an operator command (poison audit): `kubectl exec ... env USER=...`",
    "REMINDER_EMBEDDED_PG_PORT": "embedded PostgreSQL only; DATABASE_URL names the server",
    "REMINDER_EMBEDDED_BROKER_PORT": "embedded broker only; KAFKA_BOOTSTRAP_SERVERS names it",
    "DAGSTER_PG_URL": "read only where the project prepares its own instance (`up`, compose's "
    "dagster.yaml, the exporter's image instance); the chart writes Dagster's storage into the "
    "instance it mounts",
    "DAGSTER_WEBSERVER_PORT": "the port of the webserver `reminder-pipeline up` starts; the chart "
    "runs the webserver",
    "DAGSTER_HOME": "set by the image (`ENV DAGSTER_HOME`, the chart's global.dagsterHome, checked "
    "above); `metrics` reads Dagster's daemon heartbeats from that instance",
}


def _values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def _instance_yaml() -> dict:
    return yaml.safe_load((ROOT / "reminder_pipeline" / "dagster_instance.yaml").read_text())


def _deployment() -> dict:
    [deployment] = _values()["dagster-user-deployments"]["deployments"]
    return deployment


def _env_names(env: list[dict]) -> set[str]:
    return {item["name"] for item in env}


def _image(deployment: dict) -> str:
    return f"{deployment['image']['repository']}:{deployment['image']['tag']}"


def _manifest_containers() -> list[tuple[str, dict]]:
    out = []
    for manifest in _values()["extraManifests"]:
        if manifest["kind"] in ("Job", "Deployment"):
            spec = manifest["spec"]["template"]["spec"]
            out += [(manifest["metadata"]["name"], c) for c in spec["containers"]]
    return out


def test_the_values_parse_and_use_only_the_charts_keys():
    values = _values()
    assert set(values) <= CHART_KEYS, set(values) - CHART_KEYS
    assert values["dagster-user-deployments"]["enabled"] is True
    assert values["dagsterDaemon"]["enabled"] is True


def test_runs_are_launched_as_kubernetes_jobs_with_the_code_locations_environment():
    launcher = _values()["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    assert launcher["config"]["k8sRunLauncher"]["loadInclusterConfig"] is True
    deployment = _deployment()
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True


def test_the_user_deployment_loads_definitions_that_exist():
    args = _deployment()["dagsterApiGrpcArgs"]
    module = importlib.import_module(args[args.index("-m") + 1])
    assert isinstance(getattr(module, args[args.index("-a") + 1]), Definitions)
    # The same code location as compose's user-code service.
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    command = compose["services"]["user-code"]["command"]
    assert command[command.index("-m") + 1 : command.index("-m") + 2] == args[1:2]


def test_the_dockerfile_builds_the_image_with_the_kubernetes_run_launcher():
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    copied = " ".join(a for i, a in instructions if i == "COPY")
    assert "reminder_pipeline" in copied and "pyproject.toml" in copied
    installs = " ".join(a for i, a in instructions if i == "RUN")
    extra = re.search(r"pip install [^\n]*\.\[([a-z0-9,]+)\]", installs)
    assert extra and "k8s" in extra.group(1).split(","), "the image must install the k8s extra"
    # ... from the hash-checked production lock, which therefore pins it.
    assert "\ndagster-k8s==" in (ROOT / "requirements" / "production.txt").read_text()
    # The run pods load the instance, whose run launcher lives in dagster-k8s, pinned with the
    # Dagster family (integrations 0.29.N pair with dagster 1.13.N).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [k8s] = project["optional-dependencies"]["k8s"]
    dagster = next(d for d in project["dependencies"] if d.startswith("dagster=="))
    assert k8s.startswith("dagster-k8s==0.")
    assert k8s.split("==")[1].split(".")[2] == dagster.split("==")[1].split(".")[2]
    dagster_home = [a for i, a in instructions if i == "ENV" and "DAGSTER_HOME=" in a]
    assert dagster_home and f"DAGSTER_HOME={_values()['global']['dagsterHome']}" in dagster_home[0]


def test_the_extra_manifests_run_existing_commands_of_the_same_image():
    image = _image(_deployment())
    containers = _manifest_containers()
    assert {name for name, _ in containers} == {
        "reminder-pipeline-migrate",
        "reminder-pipeline-exporter",
    }
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, container in containers:
        assert container["image"] == image, name
        program, *args = container["command"]
        assert program in scripts, name
        _assert_the_cli_has(args)
    migrate = next(m for m in _values()["extraManifests"] if m["kind"] == "Job")
    assert "pre-install" in migrate["metadata"]["annotations"]["helm.sh/hook"]


def test_every_env_var_the_code_reads_is_set_for_every_process_running_the_code():
    read = env_vars_read_by_the_code()
    assert {"DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "OTEL_EXPORTER_OTLP_ENDPOINT"} <= set(read)
    required = set(read) - set(NOT_KUBERNETES_SETTINGS)
    env = _deployment()["env"]
    missing = required - _env_names(env)
    assert not missing, f"not set in docker/helm/values.yaml: {sorted(missing)}"
    # Secrets come from a Secret, never from the file.
    by_name = {item["name"]: item for item in env}
    for secret in ("DATABASE_URL", "KAFKA_SASL_PASSWORD"):
        assert "value" not in by_name[secret] and by_name[secret]["valueFrom"]["secretKeyRef"]


def test_the_migration_and_the_exporter_get_only_their_own_login():
    """The owner only for the migration Job; read-only logins for the exporter (the app database,
    and Dagster's storage for the daemons' heartbeats, from its own Secret); no Kafka user."""
    secret_of = {}
    for name, container in _manifest_containers():
        by_name = {item["name"]: item for item in container["env"]}
        dagster = {"DAGSTER_PG_URL"} if name == "reminder-pipeline-exporter" else set()
        assert {n for n in by_name if n.startswith(("KAFKA_", "DAGSTER_"))} == dagster, name
        secret_of[name] = by_name["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
        for variable in dagster:
            assert "value" not in by_name[variable], name
            assert by_name[variable]["valueFrom"]["secretKeyRef"] == {
                "name": secret_of[name],
                "key": "dagster-pg-url",
            }
        assert by_name["REMINDER_PIPELINE_HOME"] == {
            "name": "REMINDER_PIPELINE_HOME",
            "value": "/home/app/.reminder-pipeline",
        }
    assert secret_of == {
        "reminder-pipeline-migrate": "reminder-pipeline-migrate",
        "reminder-pipeline-exporter": "reminder-pipeline-exporter",
    }
    code_location = {i["name"]: i for i in _deployment()["env"]}["DATABASE_URL"]
    assert code_location["valueFrom"]["secretKeyRef"]["name"] not in secret_of.values()


def test_the_plain_settings_are_valid_for_the_code():
    plain = {item["name"]: item["value"] for item in _deployment()["env"] if "value" in item}
    settings = Settings.from_env(
        {
            **plain,
            "DATABASE_URL": "postgresql+psycopg://u:p@db/calendar",
            "KAFKA_SASL_PASSWORD": "secret",
        }
    )
    assert settings.kafka_bootstrap_servers == plain["KAFKA_BOOTSTRAP_SERVERS"]
    assert plain["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"


def test_dagster_storage_is_its_own_postgresql_database():
    values = _values()
    postgresql = values["postgresql"]
    assert postgresql["enabled"] is False and postgresql["postgresqlHost"]
    assert postgresql["postgresqlDatabase"] == "dagster"
    assert postgresql["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["generatePostgresqlPasswordSecret"] is False
    assert values["global"]["postgresqlSecretName"]
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def test_the_instance_settings_are_dagster_yamls():
    values, instance = _values(), _instance_yaml()
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert (
        queued["tagConcurrencyLimits"] == instance["concurrency"]["runs"]["tag_concurrency_limits"]
    )
    assert queued["dequeueIntervalSeconds"] == instance["run_queue"]["dequeue_interval_seconds"]
    monitoring = {_snake(k): v for k, v in values["dagsterDaemon"]["runMonitoring"].items()}
    assert monitoring == instance["run_monitoring"]
    assert values["telemetry"] == instance["telemetry"]
    retention = values["retention"]
    assert retention["enabled"] is True
    for ticks in ("schedule", "sensor"):
        assert (
            retention[ticks]["purgeAfterDays"] == instance["retention"][ticks]["purge_after_days"]
        )
    assert not values["pythonLogs"] and "python_logs" not in instance


def _chart_run_coordinator(queued: dict) -> dict:
    """The run_coordinator block the chart renders from queuedRunCoordinator values."""
    return {
        "module": "dagster.core.run_coordinator",
        "class": "QueuedRunCoordinator",
        "config": {
            "tag_concurrency_limits": queued["tagConcurrencyLimits"],
            "dequeue_interval_seconds": queued["dequeueIntervalSeconds"],
        },
    }


@pytest.mark.parametrize("limit", [None, 3])
def test_the_dispatch_schedule_follows_the_limit_written_in_the_values(limit):
    queued = _values()["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    [dispatch] = [
        t
        for t in queued["tagConcurrencyLimits"]
        if (t["key"], t["value"]) == (CONCURRENCY_TAG, CONCURRENCY_VALUE)
    ]
    if limit is not None:  # an operator raising it to N concurrent dispatch runs
        queued = {**queued, "tagConcurrencyLimits": [{**dispatch, "limit": limit}]}
    expected = limit or dispatch["limit"]
    overrides = {"run_coordinator": _chart_run_coordinator(queued)}
    with instance_for_test(overrides=overrides) as instance:
        assert dispatch_concurrency_limit(build_schedule_context(instance=instance)) == expected


def _assert_the_cli_has(args: list[str]) -> None:
    """Every subcommand and option of ``args`` exists in the click CLI."""
    import click

    command: click.Command = cli
    options = {o for p in cli.params for o in p.opts}
    for arg in args:
        if arg.startswith("-"):
            assert arg.split("=")[0] in options, f"{args}: no option {arg}"
        elif isinstance(command, click.Group) and arg in command.commands:
            command = command.commands[arg]
            options |= {o for p in command.params for o in p.opts}
    assert not isinstance(command, click.Group), f"{args}: names a group, not a command"
