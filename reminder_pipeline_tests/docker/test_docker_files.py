"""The production deployment under docker/, checked without a Docker engine.

The compose file and the Dockerfile parse; every environment variable the code reads (found in
the source, not listed by hand) is set for each service that runs the code; every file a
service mounts or the image copies exists; the Prometheus config, alert rules and their unit
tests pass promtool; the Grafana dashboard loads, has the "Background jobs" row, and only
queries metrics the exporter serves.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from reminder_pipeline.config import Settings
from reminder_pipeline.domain import contract
from reminder_pipeline.observability import health, metric_names

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
PACKAGE = ROOT / "reminder_pipeline"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
PROMETHEUS = DOCKER / "prometheus"
RULES = PROMETHEUS / "rules" / "reminder-dispatch.rules.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "calendar-overview.json"

#: Read by the code but deliberately not set in compose, each with the reason.
NOT_DEPLOYMENT_SETTINGS = {
    "USER": "who ran an operator command (poison audit): `docker compose exec -e USER=...`",
    "REMINDER_EMBEDDED_PG_PORT": "embedded PostgreSQL only; compose sets DATABASE_URL",
    "REMINDER_EMBEDDED_BROKER_PORT": "embedded broker only; compose sets KAFKA_BOOTSTRAP_SERVERS",
}
SEED_ALERTS = {
    "ReminderDispatchNotLive",
    "ReminderDispatchOverdue",
    "ReminderDispatchErrors",
    "ReminderOutboxBacklog",
    "ReminderDispatchLatenessSLOBurn",
}
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?([-?])([^}]*))?\}")

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None,
    reason="promtool not installed (Debian: apt-get install prometheus; scripts/test installs it)",
)


# --- helpers ----------------------------------------------------------------------------------


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if _ENV_NAME.match(node.value) else None
    return None


def env_vars_read_by_the_code() -> dict[str, set[str]]:
    """Every environment variable name the package reads, with the files reading it.

    Recognised: ``os.environ[...]``/``.get``, ``os.getenv``, ``env.get`` on a mapping named
    ``env``/``environ``, Dagster's ``EnvVar(...)``, ``"X" in os.environ`` and the config helpers
    called as ``helper(env, "X", ...)``.
    """
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            names: list[str | None] = []
            if isinstance(node, ast.Call):
                func = node.func
                first = node.args[0] if node.args else None
                owner = _name_of(func.value) if isinstance(func, ast.Attribute) else None
                mapping_get = (
                    isinstance(func, ast.Attribute)
                    and owner in ("env", "environ")
                    and func.attr in ("get", "pop", "setdefault")
                )
                env_var = _name_of(func) in ("getenv", "EnvVar") or owner == "EnvVar"
                if mapping_get or env_var:
                    names.append(_str(first))
                elif (
                    first is not None
                    and _name_of(first) in ("env", "environ")
                    and len(node.args) > 1
                ):
                    names.append(_str(node.args[1]))
            elif (
                isinstance(node, ast.Subscript)
                and _name_of(node.value) in ("env", "environ")
                and isinstance(node.ctx, ast.Load)
            ):
                names.append(_str(node.slice))
            elif (
                isinstance(node, ast.Compare)
                and len(node.comparators) == 1
                and isinstance(node.ops[0], ast.In | ast.NotIn)
                and _name_of(node.comparators[0]) in ("env", "environ")
            ):
                names.append(_str(node.left))
            for name in names:
                if name:
                    found.setdefault(name, set()).add(rel)
    return found


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _project_services(compose: dict) -> dict[str, dict]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with an empty environment: the defaults; a required
    ``${VAR:?message}`` (a password) as a placeholder value."""
    return _INTERPOLATION.sub(
        lambda m: f"required-{m.group(1).lower()}" if m.group(2) == "?" else m.group(3) or "",
        str(value),
    )


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _interpolate(v) for k, v in env.items()}


def _command(service: dict) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation line"
    return out


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


# --- compose ----------------------------------------------------------------------------------


def test_compose_parses_and_has_the_whole_deployment():
    compose = _compose()
    services = set(compose["services"])
    assert {
        "postgres",
        "kafka",
        "kafka-init",
        "migrate",
        "user-code",
        "webserver",
        "daemon",
        "exporter",
        "prometheus",
        "grafana",
    } <= services
    assert set(_project_services(compose)) >= {
        "migrate",
        "user-code",
        "webserver",
        "daemon",
        "exporter",
    }
    for name, service in compose["services"].items():
        for dependency in service.get("depends_on") or []:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes") or []:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                declared = compose.get("volumes") or {}
                assert source in declared, f"{name}: undeclared volume {source}"


#: Each role's own settings: a service gets the common settings and only its role's.
ROLE_SETTINGS = {
    "DATABASE_URL",
    "DAGSTER_PG_URL",
    "DAGSTER_HOME",
    "DAGSTER_WEBSERVER_PORT",
    "REMINDER_BATCH_SIZE",
    "REMINDER_CYCLE_BUDGET_SECONDS",
    "REMINDER_METRICS_HOST",
    "REMINDER_METRICS_PORT",
}


def test_every_env_var_the_code_reads_is_set_for_every_service_running_the_code():
    """The code location runs everything (dispatch runs too): it gets every setting; the other
    services get the common ones and what their own command uses (test_compose_security.py)."""
    read = env_vars_read_by_the_code()
    # The scan finds what it must (guards against a scan that silently finds nothing).
    assert {
        "DATABASE_URL",
        "KAFKA_BOOTSTRAP_SERVERS",
        "REMINDER_METRICS_PORT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    } <= set(read)
    required = set(read) - set(NOT_DEPLOYMENT_SETTINGS) | {"DAGSTER_PG_URL", "DAGSTER_HOME"}
    kafka = {name for name in required if name.startswith("KAFKA_")}
    common = required - ROLE_SETTINGS - kafka
    dagster = {"DAGSTER_PG_URL", "DAGSTER_HOME"}
    own = {
        "user-code": required,
        "webserver": common | dagster,
        "daemon": common | dagster,
        # Dagster's instance too: the daemons' heartbeats (as a read-only login).
        "exporter": common
        | dagster
        | {"DATABASE_URL", "REMINDER_METRICS_HOST", "REMINDER_METRICS_PORT"},
        "migrate": common | {"DATABASE_URL"},
        "notifications-consumer": common | kafka | {"REMINDER_METRICS_HOST"},
    }
    missing = {
        name: sorted(own[name] - set(_environment(service)))
        for name, service in _project_services(_compose()).items()
    }
    missing = {name: gaps for name, gaps in missing.items() if gaps}
    where = {var: sorted(read.get(var, ())) for gaps in missing.values() for var in gaps}
    assert not missing, f"not set in docker/compose.yaml: {missing}; read in {where}"


def test_the_compose_settings_are_valid_and_name_the_compose_servers():
    compose = _compose()
    app_database = compose["services"]["postgres"]["environment"]["POSTGRES_DB"]
    for name, service in _project_services(compose).items():
        env = _environment(service)
        settings = Settings.from_env(env)  # the code's own validation: one-line errors
        if "DATABASE_URL" in env:
            database = make_url(settings.database_url)
            assert (database.drivername, database.host, database.database) == (
                "postgresql+psycopg",
                "postgres",
                app_database,
            ), name
        if "DAGSTER_PG_URL" in env:
            dagster = make_url(env["DAGSTER_PG_URL"])
            assert (dagster.drivername, dagster.host, dagster.database) == (
                "postgresql+psycopg2",
                "postgres",
                "dagster",
            ), name
        if "KAFKA_BOOTSTRAP_SERVERS" in env:
            assert settings.kafka_bootstrap_servers == "kafka:9092"
    kafka_env = compose["services"]["kafka"]["environment"]
    assert "PLAINTEXT://kafka:9092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    # Dagster's database is created by the PostgreSQL init script.
    init = (DOCKER / "postgres" / "initdb").glob("*.sql")
    assert any("CREATE DATABASE dagster" in f.read_text() for f in init)


def test_every_file_a_service_mounts_exists():
    mounted = 0
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                path = (DOCKER / source).resolve()
                assert path.exists(), f"{name} mounts {source}, which does not exist"
                mounted += 1
    assert mounted >= 6


def test_kafka_runs_kraft_and_the_topic_is_created_with_the_contracts_partitions():
    services = _compose()["services"]
    env = services["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    init = services["kafka-init"]
    args = [*init["entrypoint"], *_command(init)]
    assert args[0].endswith("kafka-topics.sh")
    assert args[args.index("--topic") + 1] == contract.TOPIC
    assert args[args.index("--partitions") + 1] == str(contract.PARTITIONS)
    assert "--if-not-exists" in args
    assert services["kafka-init"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_project_services_run_migrations_dagster_and_the_exporter():
    services = _compose()["services"]
    assert _command(services["migrate"]) == ["reminder-pipeline", "db", "upgrade"]
    grpc = _command(services["user-code"])
    assert grpc[:3] == ["dagster", "api", "grpc"]
    assert grpc[grpc.index("-m") + 1] == "reminder_pipeline.definitions"
    assert grpc[grpc.index("-a") + 1] == "defs"
    assert _command(services["exporter"]) == ["reminder-pipeline", "metrics"]
    assert _environment(services["exporter"])["REMINDER_METRICS_HOST"] == "0.0.0.0"
    for name in ("user-code", "webserver", "daemon"):
        assert services[name]["depends_on"]["user-code" if name != "user-code" else "db-roles"]
    # db-roles runs after migrate: user code starts on a migrated schema with its grants.
    for name, after in (("user-code", "db-roles"), ("db-roles", "migrate")):
        assert services[name]["depends_on"][after]["condition"] == "service_completed_successfully"

    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    [location] = workspace["load_from"]
    server = location["grpc_server"]
    assert server["host"] == "user-code"
    assert str(server["port"]) == grpc[grpc.index("-p") + 1]
    dagster_home = _environment(services["webserver"])["DAGSTER_HOME"]
    for name in ("webserver", "daemon"):
        command = _command(services[name])
        assert command[command.index("-w") + 1] == f"{dagster_home}/workspace.yaml"


# --- Dockerfile -------------------------------------------------------------------------------

KNOWN_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def test_the_dockerfile_parses_and_builds_this_project_from_existing_files():
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    assert {i for i, _ in instructions} <= KNOWN_INSTRUCTIONS
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert any(
        i == "RUN" and re.search(r"pip install --no-deps --no-build-isolation \"?\.", args)
        for i, args in instructions
    )
    users = [args for i, args in instructions if i == "USER"]
    assert users and users[-1] not in ("root", "0")

    build = _project_services(_compose())["user-code"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]).resolve() == DOCKERFILE
    copied = 0
    for instruction, args in instructions:
        if instruction != "COPY":
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        for source in parts[:-1]:
            assert (context / source).exists(), f"COPY {source}: not in the build context"
            copied += 1
    assert copied >= 4

    env = " ".join(args for i, args in instructions if i == "ENV")
    dagster_home = _environment(_compose()["services"]["webserver"])["DAGSTER_HOME"]
    assert f"DAGSTER_HOME={dagster_home}" in env
    # The image's instance config is the one the package ships: Dagster storage from DAGSTER_PG_URL.
    instance_yaml = ROOT / "reminder_pipeline" / "dagster_instance.yaml"
    assert f'COPY --chown=app {instance_yaml.relative_to(ROOT)} "$DAGSTER_HOME/dagster.yaml"' in (
        DOCKERFILE.read_text()
    )
    instance = yaml.safe_load(instance_yaml.read_text())
    assert instance["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}


# --- Prometheus -------------------------------------------------------------------------------


@needs_promtool
def test_promtool_accepts_the_prometheus_config():
    result = _run(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    result = _run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_every_alert_passes_its_promtool_unit_tests():
    tests = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
    assert tests
    result = _run(promtool, "test", "rules", *map(str, tests))
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {
        a["alertname"]
        for t in tests
        for case in yaml.safe_load(t.read_text())["tests"]
        for a in case.get("alert_rule_test", [])
        if a.get("exp_alerts")
    }
    every_alert = {
        r["alert"]
        for path in sorted((PROMETHEUS / "rules").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for r in group["rules"]
        if "alert" in r
    }
    assert tested == every_alert, "every alert (of every rule file) has a test where it fires"


def _alerts() -> dict[str, dict]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}


def _anchors(markdown: Path) -> set[str]:
    """GitHub-style anchors of a Markdown file's headings."""
    anchors = set()
    for line in markdown.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


def test_the_seeds_alerts_exist_with_severity_and_an_existing_runbook_section():
    alerts = _alerts()
    assert set(alerts) >= SEED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert (ROOT / path).is_file(), f"{name}: runbook {path} missing"
        if anchor:
            assert anchor in _anchors(ROOT / path), f"{name}: no section #{anchor} in {path}"
    # The checks Dagster shows link the same runbooks.
    assert {health.RUNBOOK_DISPATCH, health.RUNBOOK_OUTBOX} == {
        a["annotations"]["runbook_url"].partition("#")[0] for a in alerts.values()
    }


def test_prometheus_scrapes_the_exporter_service_and_alerts_to_alertmanager():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    services = _compose()["services"]
    port = _environment(services["exporter"])["REMINDER_METRICS_PORT"]
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "reminder-dispatch"]
    assert job["static_configs"][0]["targets"] == [f"exporter:{port}"]
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager:9093"] and "alertmanager" in services
    yaml.safe_load((DOCKER / "alertmanager" / "alertmanager.yml").read_text())
    mounts = [str(v) for v in services["prometheus"]["volumes"]]
    assert "./prometheus/rules:/etc/prometheus/rules:ro" in mounts
    assert config["rule_files"] == ["rules/*.rules.yml"]


# --- Grafana ----------------------------------------------------------------------------------


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_dashboard_has_the_background_jobs_row_and_its_panels():
    dashboard = _dashboard()
    assert dashboard["uid"] == "calendar-overview" and dashboard["title"] == "calendar-overview"
    panels = dashboard["panels"]
    assert panels[0]["type"] == "row" and panels[0]["title"] == "Background jobs"
    by_title = {p["title"]: p for p in panels[1:]}
    for title in (
        "Cycle duration",
        "Sent / skipped per minute",
        "Backlog",
        "Lateness p50 / p95 (SLO 120 s)",
        "Errors per minute",
        "Outbox lag",
        "Oldest snapshot (holds back vacuum)",
        "Due index: entries read per scan",
    ):
        assert by_title[title]["type"] == "timeseries", title
    lateness = by_title["Lateness p50 / p95 (SLO 120 s)"]
    exprs = [t["expr"] for t in lateness["targets"]]
    assert any("histogram_quantile(0.5," in e for e in exprs)
    assert any("histogram_quantile(0.95," in e for e in exprs)
    defaults = lateness["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None, 120]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))


def test_the_dashboard_and_rules_query_only_metrics_the_exporter_serves():
    served = set(metric_names.DISPATCH_METRIC_NAMES) | set(metric_names.HEARTBEAT_METRIC_NAMES)
    text = DASHBOARD.read_text() + RULES.read_text()
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m)
        for m in re.findall(r"calendar_reminder_dispatch_[a-z_]+", text)
    }
    assert used and used <= served, used - served


def test_grafana_provisioning_points_at_the_mounted_dashboard_and_datasource():
    grafana = _compose()["services"]["grafana"]
    mounts = dict(str(v).split(":")[:2] for v in grafana["volumes"] if str(v).startswith("."))
    provisioning = DOCKER / "grafana" / "provisioning"
    [datasource] = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "calendar.yaml").read_text())[
        "providers"
    ]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    uids = {
        t["datasource"]["uid"]
        for p in _dashboard()["panels"]
        if "targets" in p
        for t in p["targets"]
    }
    assert uids == {datasource["uid"]}


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    # promtool has no offline query check: each expression becomes a recording rule it parses.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": expr}
                    for i, expr in enumerate(_exprs(_dashboard()))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = _run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
