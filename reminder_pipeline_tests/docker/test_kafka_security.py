"""Machine-to-machine Kafka access in docker/compose.yaml, checked as text (no Docker engine here).

The broker takes only authenticated clients (SASL/SCRAM-SHA-512 for applications, SASL/PLAIN for
its own traffic and the super user), denies what no ACL allows, and gets its JAAS configuration
from a file (the image drops property values containing "="). Each application runs as its own
user with the code's SASL settings. The access script (docker/kafka/access.sh) is executed with
stand-ins for the Kafka tools that record their arguments: the ACLs it creates must be exactly
what the dispatcher (write the topic) and the notifications consumer (read the topic and its
group, write the dead-letter topic) do, for the names the code uses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from reminder_pipeline.config import Settings
from reminder_pipeline.consumer.texts import Locale
from reminder_pipeline.domain import contract
from reminder_pipeline.messaging.dead_letters import DLQ_TOPIC

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ACCESS_SCRIPT = DOCKER / "kafka" / "access.sh"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"

DISPATCHER = "reminder-dispatcher"
NOTIFICATIONS = "notifications"
CONSUMER_SERVICE = "notifications-consumer"
_INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?([-?])([^}]*))?\}")
#: What an operator must set (compose refuses to start without them: no default passwords).
SECRETS = {
    name: f"pw-{name.lower()}"
    for name in (
        "KAFKA_ADMIN_PASSWORD",
        "KAFKA_DISPATCHER_PASSWORD",
        "KAFKA_NOTIFICATIONS_PASSWORD",
    )
}


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _interpolate(value: object) -> str:
    """Compose's interpolation with the operator's secrets set and nothing else: the defaults."""

    def one(m: re.Match[str]) -> str:
        name, operator, argument = m.groups()
        if name in SECRETS:
            return SECRETS[name]
        if operator == "?":  # another required secret (a database password): any value
            return f"pw-{name.lower()}"
        return argument or ""

    return _INTERPOLATION.sub(one, str(value))


def _environment(service: dict) -> dict[str, str]:
    return {k: _interpolate(v) for k, v in (service.get("environment") or {}).items()}


def _raw_environment(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def _command(service: dict) -> list[str]:
    return [str(c) for c in service.get("command") or []]


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _config_targets(service: dict) -> dict[str, str]:
    """Compose config name -> where the service sees it."""
    return {c["source"]: c["target"] for c in service.get("configs") or []}


def _project_services(compose: dict) -> dict[str, dict]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


# -- the broker ----------------------------------------------------------------------------------


def test_the_broker_takes_only_authenticated_clients_and_denies_what_no_acl_allows() -> None:
    env = _environment(_compose()["services"]["kafka"])
    protocols = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    listeners = {item.split("://")[0] for item in env["KAFKA_LISTENERS"].split(",")}
    assert listeners == set(protocols) and set(protocols.values()) == {"SASL_PLAINTEXT"}
    # Applications on 9092 with SCRAM only; PLAIN (the super user) only where no application goes.
    assert "SASL_PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert env["KAFKA_LISTENER_NAME_SASL__PLAINTEXT_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_LISTENER_NAME_INTERNAL_SASL_ENABLED_MECHANISMS"] == "PLAIN"
    assert env["KAFKA_LISTENER_NAME_CONTROLLER_SASL_ENABLED_MECHANISMS"] == "PLAIN"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_SUPER_USERS"] == "User:admin"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_no_broker_property_value_contains_an_equals_sign() -> None:
    """The apache/kafka image silently drops such values: JAAS settings must come from a file."""
    env = _environment(_compose()["services"]["kafka"])
    dropped = [
        name
        for name, value in env.items()
        if name.startswith("KAFKA_") and name != "KAFKA_OPTS" and "=" in value
    ]
    assert not dropped


def test_the_jaas_file_and_the_admin_properties_are_mounted_where_they_are_named() -> None:
    compose = _compose()
    services = compose["services"]
    configs = compose["configs"]
    jaas = configs["kafka-jaas"]["content"]
    assert "org.apache.kafka.common.security.scram.ScramLoginModule required;" in jaas
    assert 'username="admin"' in jaas and 'user_admin="${KAFKA_ADMIN_PASSWORD:?' in jaas
    admin = dict(
        line.split("=", 1)
        for line in configs["kafka-admin"]["content"].splitlines()
        if line.strip()
    )
    assert admin["security.protocol"] == "SASL_PLAINTEXT" and admin["sasl.mechanism"] == "PLAIN"
    assert 'password="${KAFKA_ADMIN_PASSWORD:?' in admin["sasl.jaas.config"]

    broker = services["kafka"]
    jaas_path = _config_targets(broker)["kafka-jaas"]
    assert _environment(broker)["KAFKA_OPTS"] == f"-Djava.security.auth.login.config={jaas_path}"
    admin_path = _config_targets(broker)["kafka-admin"]
    assert (
        f"--bootstrap-server localhost:9094 --command-config {admin_path}"
        in (broker["healthcheck"]["test"][1])
    )
    init = services["kafka-init"]
    args = [*init["entrypoint"], *_command(init)]
    assert _option(args, "--bootstrap-server") == "kafka:9094"
    assert _option(args, "--command-config") == _config_targets(init)["kafka-admin"]
    access = services["kafka-access"]
    assert _environment(access)["KAFKA_ADMIN_CONFIG"] == _config_targets(access)["kafka-admin"]
    assert _environment(access)["KAFKA_ADMIN_BOOTSTRAP"] == "kafka:9094"


# -- the applications ----------------------------------------------------------------------------


def test_each_application_connects_as_its_own_scram_user_with_the_codes_settings() -> None:
    compose = _compose()
    access = _raw_environment(compose["services"]["kafka-access"])
    password_of = {
        access["DISPATCHER_USER"]: access["DISPATCHER_PASSWORD"],
        access["NOTIFICATIONS_USER"]: access["NOTIFICATIONS_PASSWORD"],
    }
    assert set(password_of) == {DISPATCHER, NOTIFICATIONS}
    users = {}
    for name, service in _project_services(compose).items():
        if "KAFKA_BOOTSTRAP_SERVERS" not in _environment(service):
            continue  # a service that never talks to Kafka holds no Kafka login
        settings = Settings.from_env(_environment(service)).kafka()  # the code's own validation
        config = settings.client_config()
        assert config["bootstrap.servers"] == "kafka:9092", name
        assert (config["security.protocol"], config["sasl.mechanism"]) == (
            "SASL_PLAINTEXT",
            "SCRAM-SHA-512",
        ), name
        users[name] = config["sasl.username"]
        # The secret it sends comes from the same variable kafka-access gives its user
        # (the shared block's merged in, or the service's own override).
        secret = _raw_environment(service)["KAFKA_SASL_PASSWORD"]
        assert secret == password_of[users[name]], name
        assert secret.startswith("${KAFKA_") and ":?" in secret, "a required secret, no default"
    assert users.pop(CONSUMER_SERVICE) == NOTIFICATIONS
    assert users == {"user-code": DISPATCHER}  # the dispatch runs; nothing else produces


def test_the_consumer_service_runs_consume_with_its_group_metrics_and_locale() -> None:
    compose = _compose()
    services = compose["services"]
    consumer = services[CONSUMER_SERVICE]
    args = _command(consumer)
    assert args[:2] == ["reminder-pipeline", "consume"]
    assert (
        _option(args, "--group-id") == _environment(services["kafka-access"])["NOTIFICATIONS_GROUP"]
    )
    assert Locale(_option(args, "--locale")) is Locale.RU
    port = _option(args, "--metrics-port")
    assert _environment(consumer)["REMINDER_METRICS_HOST"] == "0.0.0.0"
    prometheus = yaml.safe_load(PROMETHEUS.read_text())
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == CONSUMER_SERVICE]
    assert job["static_configs"][0]["targets"] == [f"{CONSUMER_SERVICE}:{port}"]
    assert f":{port}/metrics" in " ".join(consumer["healthcheck"]["test"])
    # Its de-duplication file (under REMINDER_PIPELINE_HOME) outlives the container.
    home = _environment(consumer)["REMINDER_PIPELINE_HOME"]
    [mount] = [str(v) for v in consumer["volumes"]]
    volume, target = mount.split(":")[:2]
    assert volume in compose["volumes"] and home.startswith(target + "/")
    # Users and ACLs exist before any application connects.
    assert consumer["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert services["kafka-init"]["depends_on"]["kafka-access"]["condition"] == (
        "service_completed_successfully"
    )
    assert services["user-code"]["depends_on"]["kafka-init"]["condition"] == (
        "service_completed_successfully"
    )


# -- the ACLs ------------------------------------------------------------------------------------


def _run_access_script(tmp_path: Path) -> list[list[str]]:
    """Run docker/kafka/access.sh with recording stand-ins for the Kafka tools; their calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("kafka-topics.sh", "kafka-configs.sh", "kafka-acls.sh"):
        stub = bin_dir / tool
        stub.write_text(
            '#!/usr/bin/env bash\n{ printf "%s" "$(basename "$0")"; '
            'for a in "$@"; do printf "\\t%s" "$a"; done; printf "\\n"; } >> "$CALLS"\n'
        )
        stub.chmod(0o755)
    service = _compose()["services"]["kafka-access"]
    [mount] = [str(v) for v in service["volumes"]]
    source, target = mount.split(":")[:2]
    assert service["entrypoint"] == ["bash", target]
    script = (DOCKER / source).resolve()
    assert script == ACCESS_SCRIPT
    env = {
        "PATH": os.environ["PATH"],
        "KAFKA_BIN": str(bin_dir),
        "CALLS": str(log),
        **_environment(service),
    }
    result = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.split("\t") for line in log.read_text().splitlines()]


def _acls(calls: list[list[str]]) -> set[tuple[str, str, str, str, str]]:
    """(principal, operation, resource type, resource name, pattern type) of each ACL added."""
    acls = set()
    for call in calls:
        if call[0] != "kafka-acls.sh":
            continue
        args = call[1:]
        assert "--add" in args and "--deny-principal" not in args
        principal = _option(args, "--allow-principal")
        operations = [args[i + 1] for i, a in enumerate(args) if a == "--operation"]
        kinds = [k for k in ("--topic", "--group", "--cluster", "--transactional-id") if k in args]
        assert len(kinds) == 1, call
        kind = kinds[0].lstrip("-")
        name = _option(args, kinds[0])
        assert "*" not in name, "no wildcard resources"
        pattern = _option(args, "--resource-pattern-type")
        acls |= {(principal, op, kind, name, pattern) for op in operations}
    return acls


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_acls_allow_exactly_what_each_application_does(tmp_path: Path) -> None:
    calls = _run_access_script(tmp_path)
    for call in calls:
        assert _option(call[1:], "--bootstrap-server") == "kafka:9094"
        assert _option(call[1:], "--command-config") == "/etc/kafka/secrets/admin.properties"
    group = _option(_command(_compose()["services"][CONSUMER_SERVICE]), "--group-id")
    topic, dlq = contract.TOPIC, DLQ_TOPIC
    assert _acls(calls) == {
        (f"User:{DISPATCHER}", "Write", "topic", topic, "literal"),
        (f"User:{DISPATCHER}", "Describe", "topic", topic, "literal"),
        (f"User:{NOTIFICATIONS}", "Read", "topic", topic, "literal"),
        (f"User:{NOTIFICATIONS}", "Describe", "topic", topic, "literal"),
        (f"User:{NOTIFICATIONS}", "Read", "group", group, "literal"),
        (f"User:{NOTIFICATIONS}", "Write", "topic", dlq, "literal"),
        (f"User:{NOTIFICATIONS}", "Describe", "topic", dlq, "literal"),
    }


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_scram_users_and_the_dead_letter_topic_are_created(tmp_path: Path) -> None:
    calls = _run_access_script(tmp_path)
    users = {}
    for call in (c for c in calls if c[0] == "kafka-configs.sh"):
        args = call[1:]
        assert "--alter" in args and _option(args, "--entity-type") == "users"
        credential = re.fullmatch(
            r"SCRAM-SHA-512=\[iterations=(\d+),password=([^,\]]+)\]", _option(args, "--add-config")
        )
        assert credential and int(credential.group(1)) >= 4096
        users[_option(args, "--entity-name")] = credential.group(2)
    assert users == {
        DISPATCHER: SECRETS["KAFKA_DISPATCHER_PASSWORD"],
        NOTIFICATIONS: SECRETS["KAFKA_NOTIFICATIONS_PASSWORD"],
    }
    [create] = [c[1:] for c in calls if c[0] == "kafka-topics.sh"]
    assert "--create" in create and "--if-not-exists" in create
    assert _option(create, "--topic") == DLQ_TOPIC
    assert _option(create, "--partitions") == str(contract.PARTITIONS)


def test_the_codes_sasl_settings_are_documented() -> None:
    names = (
        "KAFKA_SECURITY_PROTOCOL",
        "KAFKA_SASL_MECHANISM",
        "KAFKA_SASL_USERNAME",
        "KAFKA_SASL_PASSWORD",
    )
    for document in (ROOT / "docs" / "deployment.md", ROOT / "docs" / "contract.md"):
        text = document.read_text()
        assert all(name in text for name in names), document
        assert "SCRAM-SHA-512" in text, document
