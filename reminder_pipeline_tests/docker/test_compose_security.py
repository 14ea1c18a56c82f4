"""docker/compose.yaml's least privilege, checked without a Docker engine.

No password has a default (compose's ``${VAR:?message}`` refuses to start without it); every
published port listens on 127.0.0.1 unless REMINDER_BIND_ADDRESS says otherwise; migrations run
as the schema owner and nothing else does; the role script runs after them, and the user code
and its run workers connect as the least-privilege login it creates. Each service is given only
the credentials it uses (the notifications consumer, which parses outside input, only its Kafka
user and its de-dup login; the exporter only its read-only logins on the app database and on
Dagster's storage); Prometheus has no lifecycle API; Alertmanager is reachable by
Prometheus only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_TEXT = (DOCKER / "compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
PASSWORDS = (
    "POSTGRES_PASSWORD",
    "REMINDER_APP_DB_PASSWORD",
    "DAGSTER_DB_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
    "KAFKA_ADMIN_PASSWORD",
    "KAFKA_DISPATCHER_PASSWORD",
    "KAFKA_NOTIFICATIONS_PASSWORD",
    "REMINDER_READER_DB_PASSWORD",
    "DAGSTER_READER_DB_PASSWORD",
    "NOTIFICATIONS_DEDUP_DB_PASSWORD",
)
_VARIABLE = re.compile(r"\$\{([A-Z0-9_]+)(?:(:?[-?])([^}]*))?\}")
BIND = "${REMINDER_BIND_ADDRESS:-127.0.0.1}"


class MissingVariable(Exception):
    """Compose would refuse to start: a required variable is unset."""


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ``${X}``, ``${X:-default}``, ``${X:?message}`` (refuses)."""

    def one(match: re.Match[str]) -> str:
        name, operator, argument = match.groups()
        if env.get(name):
            return env[name]
        if operator in (":?", "?"):
            raise MissingVariable(f"{name}: {argument}")
        return argument if operator in (":-", "-") else ""

    return _VARIABLE.sub(one, value)


def _strings(node: object):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def _environment(name: str, env: dict[str, str]) -> dict[str, str]:
    return {
        k: interpolate(str(v), env) for k, v in (SERVICES[name].get("environment") or {}).items()
    }


FULL_ENV = {name: f"pw-{name.lower()}" for name in PASSWORDS}


def test_every_password_is_required_and_has_no_default():
    used = {m.group(1) for m in _VARIABLE.finditer(COMPOSE_TEXT) if "PASSWORD" in m.group(1)}
    assert set(PASSWORDS) <= used
    for match in _VARIABLE.finditer(COMPOSE_TEXT):
        if "PASSWORD" in match.group(1) and not match.group(1).startswith("KAFKA_"):
            assert match.group(2) == ":?", f"{match.group(0)} must be ${{VAR:?message}}"


@pytest.mark.parametrize("missing", PASSWORDS)
def test_compose_refuses_to_start_without_each_password(missing):
    env = {k: v for k, v in FULL_ENV.items() if k != missing}
    with pytest.raises(MissingVariable, match=missing):
        for text in _strings(COMPOSE):
            interpolate(text, env)
    for text in _strings(COMPOSE):  # and with all of them it interpolates
        interpolate(text, FULL_ENV)


def test_published_ports_listen_on_loopback_unless_the_operator_says_otherwise():
    published = 0
    for name, service in SERVICES.items():
        for port in service.get("ports") or []:
            assert str(port).startswith(f"{BIND}:"), f"{name} publishes {port} on every interface"
            published += 1
            assert interpolate(str(port), {}).startswith("127.0.0.1:")
            assert interpolate(str(port), {"REMINDER_BIND_ADDRESS": "0.0.0.0"}).startswith(
                "0.0.0.0:"
            )
    assert published >= 5


def _project_services() -> list[str]:
    return [name for name, service in SERVICES.items() if "build" in service]


#: The credentials (password variables) each service uses, and nothing more. The postgres
#: service creates the de-dup login on its first start; the role steps create the other logins.
USES = {
    "postgres": {"POSTGRES_PASSWORD", "NOTIFICATIONS_DEDUP_DB_PASSWORD"},
    "kafka": {"KAFKA_ADMIN_PASSWORD"},
    "kafka-init": {"KAFKA_ADMIN_PASSWORD"},
    "kafka-access": {
        "KAFKA_ADMIN_PASSWORD",
        "KAFKA_DISPATCHER_PASSWORD",
        "KAFKA_NOTIFICATIONS_PASSWORD",
    },
    "notifications-consumer": {"KAFKA_NOTIFICATIONS_PASSWORD", "NOTIFICATIONS_DEDUP_DB_PASSWORD"},
    "migrate": {"POSTGRES_PASSWORD"},
    "db-roles": {"POSTGRES_PASSWORD", "REMINDER_APP_DB_PASSWORD", "DAGSTER_DB_PASSWORD"},
    "db-reader-role": {"POSTGRES_PASSWORD", "REMINDER_READER_DB_PASSWORD"},
    "db-dagster-reader-role": {"POSTGRES_PASSWORD", "DAGSTER_READER_DB_PASSWORD"},
    "user-code": {"REMINDER_APP_DB_PASSWORD", "DAGSTER_DB_PASSWORD", "KAFKA_DISPATCHER_PASSWORD"},
    "webserver": {"DAGSTER_DB_PASSWORD"},
    "daemon": {"DAGSTER_DB_PASSWORD"},
    # Its two read-only logins (the app database, Dagster's storage), never an owner's.
    "exporter": {"REMINDER_READER_DB_PASSWORD", "DAGSTER_READER_DB_PASSWORD"},
    "prometheus": set(),
    "alertmanager": set(),
    "grafana": {"GRAFANA_ADMIN_PASSWORD"},
    "jaeger": set(),
}
_CONFIGS = COMPOSE.get("configs") or {}


def _credentials_given(name: str) -> set[str]:
    """Every password a service can read: its environment, and the generated configs it mounts."""
    service = SERVICES[name]
    texts = [str(v) for v in (service.get("environment") or {}).values()]
    texts += [str(_CONFIGS[c["source"]]["content"]) for c in service.get("configs") or []]
    given = {m.group(1) for text in texts for m in _VARIABLE.finditer(text)}
    return {v for v in given if v.endswith("PASSWORD")}


def test_every_service_is_given_only_the_credentials_it_uses():
    assert set(SERVICES) == set(USES), "a new service: say here which credentials it uses"
    for name, uses in USES.items():
        assert _credentials_given(name) == uses, name


def test_the_notifications_consumer_holds_no_database_or_dagster_login_of_the_calendar():
    env = _environment("notifications-consumer", FULL_ENV)
    assert not {"DATABASE_URL", "DAGSTER_PG_URL", "DAGSTER_HOME"} & set(env)
    assert env["KAFKA_SASL_USERNAME"] == "notifications"
    assert env["KAFKA_SASL_PASSWORD"] == FULL_ENV["KAFKA_NOTIFICATIONS_PASSWORD"]
    dedup = make_url(env["REMINDER_CONSUMER_DEDUP_URL"])
    assert (dedup.username, dedup.password, dedup.database) == (
        "notifications_dedup",
        FULL_ENV["NOTIFICATIONS_DEDUP_DB_PASSWORD"],
        "notifications",
    )
    script = (DOCKER / "postgres" / "initdb" / "20-notifications-dedup.sh").read_text()
    assert "NOTIFICATIONS_DEDUP_DB_USER:-notifications_dedup" in script
    assert "NOTIFICATIONS_DEDUP_DB_NAME:-notifications" in script
    assert "GRANT SELECT, INSERT, DELETE ON reminder_dedup" in script


#: Who gets a URL of Dagster's storage, and as which login: Dagster's processes as its owner,
#: the exporter (the daemons' heartbeats) as the read-only login db-dagster-reader-role makes.
DAGSTER_STORAGE_LOGINS = {
    "user-code": ("dagster_storage", "DAGSTER_DB_PASSWORD"),
    "webserver": ("dagster_storage", "DAGSTER_DB_PASSWORD"),
    "daemon": ("dagster_storage", "DAGSTER_DB_PASSWORD"),
    "exporter": ("dagster_reader", "DAGSTER_READER_DB_PASSWORD"),
}


def test_only_dagsters_processes_and_the_exporter_get_the_dagster_storage_url():
    for name in SERVICES:
        env = _environment(name, FULL_ENV)
        assert ("DAGSTER_PG_URL" in env) == (name in DAGSTER_STORAGE_LOGINS), name
        if "DAGSTER_PG_URL" in env:
            storage = make_url(env["DAGSTER_PG_URL"])
            user, password = DAGSTER_STORAGE_LOGINS[name]
            assert (storage.username, storage.password) == (user, FULL_ENV[password]), name
            assert env["DAGSTER_HOME"] == "/opt/dagster/dagster_home", name


def test_the_exporters_dagster_login_is_the_read_only_one_the_role_step_makes():
    step = _environment("db-dagster-reader-role", FULL_ENV)
    assert (step["PGUSER"], step["PGPASSWORD"]) == ("reminder", FULL_ENV["POSTGRES_PASSWORD"])
    assert step["PGDATABASE"] == "dagster"
    exporter = make_url(_environment("exporter", FULL_ENV)["DAGSTER_PG_URL"])
    assert exporter.database == step["PGDATABASE"]
    assert (exporter.username, exporter.password) == (
        step["DAGSTER_READER_DB_USER"],
        step["DAGSTER_READER_DB_PASSWORD"],
    )
    # The default privileges are for the login that creates Dagster's tables.
    storage = make_url(_environment("daemon", FULL_ENV)["DAGSTER_PG_URL"])
    assert step["DAGSTER_DB_USER"] == storage.username
    script = (DOCKER / "postgres" / "roles" / "dagster_reader_role.sql").read_text()
    for variable in re.findall(r"\\getenv \w+ (\w+)", script):
        assert variable in step, f"dagster_reader_role.sql reads {variable}, which is not set"
    assert "default_transaction_read_only = on" in script
    assert "NOINHERIT" in script and "NOSUPERUSER" in script


def test_only_the_migrate_step_connects_as_the_schema_owner():
    owner = interpolate("${POSTGRES_USER:-reminder}", {})
    migrate = make_url(_environment("migrate", FULL_ENV)["DATABASE_URL"])
    assert (migrate.username, migrate.password) == (owner, FULL_ENV["POSTGRES_PASSWORD"])
    assert SERVICES["migrate"]["restart"] == "no"  # the owner only while it runs
    logins = {
        "user-code": ("reminder_app", "REMINDER_APP_DB_PASSWORD"),
        "exporter": ("reminder_reader", "REMINDER_READER_DB_PASSWORD"),
    }
    for name in _project_services():
        env = _environment(name, FULL_ENV)
        command = [str(c) for c in SERVICES[name].get("command") or []]
        if name == "migrate":
            assert command == ["reminder-pipeline", "db", "upgrade"]
            continue
        assert not {"db", "upgrade"} <= set(command), f"{name} migrates"
        if name in logins:
            app = make_url(env["DATABASE_URL"])
            user, password = logins[name]
            assert (app.username, app.password) == (user, FULL_ENV[password]), name
        else:
            assert "DATABASE_URL" not in env, name
        if "DAGSTER_PG_URL" in env:
            dagster = make_url(env["DAGSTER_PG_URL"])
            user, password = DAGSTER_STORAGE_LOGINS[name]
            assert (dagster.username, dagster.password) == (user, FULL_ENV[password]), name


def test_prometheus_has_no_lifecycle_api():
    command = [str(c) for c in SERVICES["prometheus"]["command"]]
    assert not any(c.startswith("--web.enable-lifecycle") for c in command)
    assert not any(c.startswith("--web.enable-admin-api") for c in command)


def test_alertmanager_is_reachable_by_prometheus_only():
    alertmanager = SERVICES["alertmanager"]
    assert not alertmanager.get("ports"), "Alertmanager's API (silences) published on the host"
    networks = set(alertmanager.get("networks") or ["default"])
    assert networks == {"alerting"}
    assert COMPOSE["networks"]["alerting"].get("internal") is True
    on_alerting = {n for n, s in SERVICES.items() if "alerting" in (s.get("networks") or [])}
    assert on_alerting == {"alertmanager", "prometheus"}


def test_the_role_scripts_run_after_migrating_and_before_the_user_code_and_exporter():
    roles = SERVICES["db-roles"]
    command = [*roles["entrypoint"], *(roles.get("command") or [])]
    assert command[0] == "psql" and "ON_ERROR_STOP=1" in command
    files = [command[i + 1] for i, arg in enumerate(command) if arg == "-f"]
    assert files == ["/sql/dispatcher_role.sql", "/sql/login_roles.sql"]
    [mount] = roles["volumes"]
    source, target = str(mount).split(":")[:2]
    for file in files:
        assert (DOCKER / source / Path(file).relative_to(target)).is_file()
    assert roles["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name, step in (
        ("user-code", "db-roles"),
        ("db-reader-role", "db-roles"),
        ("db-dagster-reader-role", "db-roles"),
        ("exporter", "db-reader-role"),
        ("exporter", "db-dagster-reader-role"),
    ):
        assert SERVICES[name]["depends_on"][step]["condition"] == "service_completed_successfully"
    env = _environment("db-roles", FULL_ENV)
    assert (env["PGUSER"], env["PGPASSWORD"]) == ("reminder", FULL_ENV["POSTGRES_PASSWORD"])
    login = (ROOT / "sql" / "login_roles.sql").read_text()
    for variable in re.findall(r"\\getenv \w+ (\w+)", login):
        assert variable in env, f"login_roles.sql reads {variable}, which db-roles does not set"
    # The logins db-roles creates are the ones the services connect as.
    assert (
        env["REMINDER_APP_DB_USER"]
        == make_url(_environment("user-code", FULL_ENV)["DATABASE_URL"]).username
    )
    assert (
        env["DAGSTER_DB_USER"]
        == make_url(_environment("user-code", FULL_ENV)["DAGSTER_PG_URL"]).username
    )


def test_grafana_has_no_default_admin_password():
    env = _environment("grafana", FULL_ENV)
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == FULL_ENV["GRAFANA_ADMIN_PASSWORD"]
    with pytest.raises(MissingVariable):
        _environment("grafana", {})
