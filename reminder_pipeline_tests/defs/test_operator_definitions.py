"""The definitions with the checks, the operator jobs, their schedules and the failure sensor still load and validate."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from dagster import (
    AssetCheckKey,
    DagsterInvalidConfigError,
    DefaultSensorStatus,
    Definitions,
    UrlMetadataValue,
    validate_run_config,
)

from reminder_pipeline.config import docs_base_url
from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.assets import DISPATCH_ASSET_KEY
from reminder_pipeline.observability.health import ASSERTIONS

JOBS = {
    "reminder_dispatch",
    "reminder_catch_up",
    "reminder_health_checks",
    "reminder_poison_rows",
    "outbox_retention",
    "dagster_run_retention",
    "reminder_trace",
}
SCHEDULES = {
    "reminder_dispatch_schedule": "reminder_dispatch",
    "outbox_retention_schedule": "outbox_retention",
    "dagster_run_retention_schedule": "dagster_run_retention",
}


def test_everything_loads_and_validates_without_any_environment(monkeypatch):
    for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL"):
        monkeypatch.delenv(name, raising=False)
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= JOBS
    assert {s.name: s.job_name for s in repo.schedule_defs} == SCHEDULES
    sensors = {s.name: s for s in repo.sensor_defs}
    assert set(sensors) == {
        "reminder_health_sensor",
        "reminder_dispatch_failure_ledger",
        "reminder_republish_days",
    }
    assert all(s.default_status is DefaultSensorStatus.RUNNING for s in sensors.values())


def test_the_dispatcher_asset_has_its_five_checks_and_a_five_minute_freshness_policy():
    graph = defs.resolve_asset_graph()
    assert graph.get(DISPATCH_ASSET_KEY).freshness_policy.fail_window.to_timedelta() == timedelta(
        minutes=5
    )
    for name in ASSERTIONS:
        spec = graph.get_check_spec(AssetCheckKey(DISPATCH_ASSET_KEY, name))
        assert spec.description
        runbook = spec.metadata["runbook"]  # a link into the docs (issue 35), not a path
        assert isinstance(runbook, UrlMetadataValue), runbook
        assert runbook.value.startswith(docs_base_url() + "runbooks/")
    assert graph.get_check_keys_for_assets({DISPATCH_ASSET_KEY}) == {
        AssetCheckKey(DISPATCH_ASSET_KEY, n) for n in ASSERTIONS
    }


def test_operator_job_defaults(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    poison = validate_run_config(defs.get_job_def("reminder_poison_rows"), {})["ops"]
    assert poison["poison_rows"]["config"] == {
        "action": "list",
        "reminder_id": None,
        "force": False,
        "all": False,
        "event_id": None,
        "kind": None,
        "failed_since": None,
        "dry_run": False,
        "limit": 100,
    }
    purge = validate_run_config(defs.get_job_def("outbox_retention"), {})["ops"]
    assert purge["purge_outbox"]["config"] == {"retention_hours": 168.0, "batch_size": 1000}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"action": "skip"}, "skip needs reminder_id or a filter"),
        ({"action": "skip", "reminder_id": str(uuid.uuid4()), "all": True}, "not both"),
        ({"action": "retry", "all": True, "kind": "Meeting"}, "all takes every poison row"),
        ({"action": "retry", "kind": "Meeting", "force": True}, "force acts on one reminder_id"),
        ({"action": "list", "all": True}, "go with retry or skip"),
        ({"action": "skip", "failed_since": "yesterday"}, "failed_since='yesterday' is not"),
        ({"action": "skip", "event_id": "42"}, "event_id '42' is not a UUID"),
    ],
)
def test_the_poison_jobs_filter_is_refused_in_one_line_when_it_makes_no_sense(
    monkeypatch, config, says
):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    with pytest.raises(DagsterInvalidConfigError) as refused:
        validate_run_config(defs.get_job_def("reminder_poison_rows"), config)
    assert "reminder_poison_rows run config refused" in str(refused.value)
    assert says in str(refused.value), str(refused.value)


def test_the_trace_job_takes_an_id_and_refuses_a_bad_one(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://user@127.0.0.1:5432/reminders")
    job = defs.get_job_def("reminder_trace")
    rid = str(uuid.uuid4())
    ops = validate_run_config(job, {"id": rid.upper()})["ops"]
    assert ops["trace_reminders"]["config"]["id"] == rid
    with pytest.raises(DagsterInvalidConfigError, match="is not a reminder or event id"):
        validate_run_config(job, {"id": "42"})
