"""Helpers of the Dagster-layer tests (jobs, schedule, resources, re-execution).

The suite's fixtures are in ``../conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml
from dagster import DagsterEvent, DagsterInstance

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.defs.resources import KafkaResource, PostgresResource
from reminder_pipeline.local.dagster_processes import INSTANCE_YAML


def resources_for(database_url: str, kafka: KafkaSettings | str, **kafka_overrides: Any) -> dict:
    """Resources on the test's database and broker (``kafka`` may be a dead ``host:port``)."""
    servers = kafka.bootstrap_servers if isinstance(kafka, KafkaSettings) else kafka
    kafka_resource = KafkaResource(bootstrap_servers=servers, **kafka_overrides)
    return {"postgres": PostgresResource(database_url=database_url), "kafka": kafka_resource}


def instance_overrides() -> dict:
    """The shipped instance config's logging sections, if any (so the tests exercise them too)."""
    shipped = yaml.safe_load(INSTANCE_YAML.read_text())
    return {k: shipped[k] for k in ("python_logs",) if k in shipped}


def metadata_values(materialization: Any) -> dict[str, Any]:
    """A materialization's metadata as plain values."""
    return {key: value.value for key, value in materialization.metadata.items()}


def log_messages(instance: DagsterInstance, run_id: str) -> list[str]:
    """The user log lines of a run's event log (not Dagster's own events)."""
    return [e.user_message for e in instance.all_logs(run_id) if e.dagster_event is None]


def materializations(events: Iterable[DagsterEvent]) -> list[Any]:
    """The AssetMaterialization objects among ``events``."""
    return [e.event_specific_data.materialization for e in events if e.is_step_materialization]
