"""Dagster's storage on pooled connections, as ``reminder-pipeline up`` configures its instance.

The instance ``up`` writes is the shipped one with the storage block replaced by the pooled
storages (nothing else changes); an instance loaded from it, and one rebuilt from its reference as
a run worker's is, reuses its connections across storage calls on a real PostgreSQL, where the
shipped config opens and closes one per call; and once the server has dropped them (a restart),
each storage's next call at most fails once, taking the dead connection out, and the one after
reconnects.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import AssetKey, DagsterInstance
from dagster._core.instance.config import dagster_instance_config
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from reminder_pipeline.defs.pooled_storage import (
    PooledPostgresEventLogStorage,
    PooledPostgresRunStorage,
    PooledPostgresScheduleStorage,
)
from reminder_pipeline.local import dagster_processes as orchestrator


def _sessions(url: str) -> set[int]:
    """The backends now connected to the database of ``url`` (but this one)."""
    parsed = make_url(url)
    dsn = parsed.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (parsed.database,),
        ).fetchall()
    return {pid for (pid,) in rows}


def _settled(url: str, most: int) -> set[int]:
    """The backends connected once at most ``most`` remain: a closed connection's backend ends
    a moment after its client closed it."""
    deadline = time.monotonic() + 10
    while len(found := _sessions(url)) > most:
        assert time.monotonic() < deadline, f"{len(found)} backends still connected"
        time.sleep(0.05)
    return found


def _calls(instance: DagsterInstance) -> None:
    """A few calls on each storage, as a daemon's loop makes them."""
    for _ in range(5):
        instance.get_runs_count()
        instance.get_latest_materialization_event(AssetKey(["calendar", "reminder_dispatch"]))
        instance.all_instigator_state()


@pytest.fixture
def homes(
    tmp_path: Path, dagster_storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """(pooled, shipped): two DAGSTER_HOMEs on the same Dagster database."""
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_storage_url)
    pooled = orchestrator.prepare_home(tmp_path / "pooled", pooled_storage=True)
    shipped = orchestrator.prepare_home(tmp_path / "shipped")
    return pooled, shipped


def test_up_writes_the_shipped_instance_with_only_its_storage_pooled(tmp_path: Path) -> None:
    home = orchestrator.prepare_home(tmp_path / "home", pooled_storage=True)
    dagster_instance_config(str(home))  # Dagster's own schema check of what up writes
    written = yaml.safe_load((home / "dagster.yaml").read_text())
    shipped = yaml.safe_load(orchestrator.INSTANCE_YAML.read_text())
    assert {k: v for k, v in written.items() if not k.endswith("storage")} == {
        k: v for k, v in shipped.items() if k != "storage"
    }
    for key, name in orchestrator.POOLED_STORAGE_CLASSES.items():
        assert written[key] == {
            "module": orchestrator.POOLED_STORAGE_MODULE,
            "class": name,
            "config": shipped["storage"]["postgres"],
        }
    with pytest.raises(orchestrator.OrchestratorError, match="no storage block"):
        orchestrator.pooled_instance_config("telemetry:\n  enabled: false\n")


def test_the_pooled_instance_keeps_its_connections_and_the_shipped_one_does_not(
    homes: tuple[Path, Path], dagster_storage_url: str
) -> None:
    pooled_home, shipped_home = homes
    with DagsterInstance.from_config(str(shipped_home)) as shipped:
        _calls(shipped)  # creates Dagster's tables too
        assert _settled(dagster_storage_url, 0) == set()  # each call closed its connection

    with DagsterInstance.from_config(str(pooled_home)) as pooled:
        assert isinstance(pooled.run_storage, PooledPostgresRunStorage)
        assert isinstance(pooled.event_log_storage, PooledPostgresEventLogStorage)
        assert isinstance(pooled.schedule_storage, PooledPostgresScheduleStorage)
        _calls(pooled)
        kept = _settled(dagster_storage_url, 3)  # one per storage at most
        assert kept
        _calls(pooled)
        assert _sessions(dagster_storage_url) == kept  # the same backends served every call

        # A run worker gets the instance by reference (the launcher passes it): pooled too.
        with DagsterInstance.from_ref(pooled.get_ref()) as worker:
            assert isinstance(worker.event_log_storage, PooledPostgresEventLogStorage)
            assert isinstance(worker.run_storage, PooledPostgresRunStorage)


def test_the_pooled_instance_reconnects_after_the_server_dropped_its_connections(
    homes: tuple[Path, Path], dagster_storage_url: str
) -> None:
    # What a PostgreSQL restart does to a pool: every kept connection is gone. A storage's first
    # call after it may fail (SQLAlchemy then drops the pool's connections); the next reconnects.
    pooled_home, _ = homes
    with DagsterInstance.from_config(str(pooled_home)) as instance:
        _calls(instance)
        kept = _settled(dagster_storage_url, 3)
        dsn = make_url(dagster_storage_url).set(drivername="postgresql", query={})
        with psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True) as conn:
            for pid in kept:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _settled(dagster_storage_url, 0)
        invalidated = []
        for call in (
            instance.get_runs_count,
            lambda: instance.get_latest_materialization_event(AssetKey(["calendar", "x"])),
            instance.all_instigator_state,
        ):
            try:
                call()
            except DBAPIError as error:  # the dropped connection, found by this call
                invalidated.append(error.connection_invalidated)
                call()  # the next one reconnects
        assert all(invalidated)  # only ever the dropped connection, taken out of the pool
        _calls(instance)
        assert _sessions(dagster_storage_url).isdisjoint(kept)
