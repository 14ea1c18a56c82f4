"""A dispatcher that could not publish what it sent does not report that all is well.

On a real PostgreSQL and broker, another session holds the relay's advisory lock the whole time
(a plain connection that took ``pg_advisory_lock``, as a relay that never lets go): nothing the
cycle wrote can be published. ``reminder-pipeline dispatch`` exits 3 (partial publish) with how
many of its rows stay unpublished and who holds the lock; a ``reminder_dispatch`` run succeeds
with a warning: ``partial_publish`` and ``unpublished_of_run`` on its materialization, a
``partial publish`` log line, and its ``outbox_backlog`` check a warning naming the holder. The
normal case, the lock held for a moment by another session that then lets go, stays exit 0.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from dagster import AssetCheckSeverity, instance_for_test

from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.store import outbox_queries
from reminder_pipeline_tests.defs.helpers import (
    instance_overrides,
    log_messages,
    metadata_values,
    resources_for,
)
from reminder_pipeline_tests.support import bulk_due, outbox_rows, run_cli

from .conftest import psycopg_dsn

pytestmark = pytest.mark.server


@contextmanager
def relay_lock_held(database_url: str) -> Iterator[psycopg.Connection]:
    """Another session holding the relay lock until the block ends (or it unlocks itself)."""
    with psycopg.connect(psycopg_dsn(database_url), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (outbox_queries.RELAY_LOCK_KEY,))
        yield other


def waiting_for_the_lock(conn: psycopg.Connection) -> bool:
    """Whether a session waits for the relay lock (the dispatcher's relay, found it busy)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted",
        (outbox_queries.RELAY_LOCK_KEY,),
    ).fetchone()
    return bool(row and row[0])


@pytest.fixture
def cli_env(database_url, kafka_settings, tmp_path) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }


def test_a_dispatch_that_cannot_publish_exits_3_the_normal_case_0(engine, database_url, cli_env):
    bulk_due(engine, 3)
    with relay_lock_held(database_url):
        result = run_cli("dispatch", "--json", "--budget-seconds", "1", env=cli_env)
    assert result.returncode == 3, (result.stdout, result.stderr)
    counts = json.loads(result.stdout)
    assert (counts["sent"], counts["published"], counts["publish_failed"]) == (3, 0, 0)
    assert counts["unpublished_of_run"] == 3

    # Held for a moment only: the relay waits, gets the lock, publishes every row, exit 0.
    bulk_due(engine, 2)
    with relay_lock_held(database_url) as other:
        done: dict[str, object] = {}
        cli = threading.Thread(
            target=lambda: done.update(result=run_cli("dispatch", "--json", env=cli_env))
        )
        cli.start()
        deadline = time.monotonic() + 60
        while not waiting_for_the_lock(other) and cli.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        other.execute("SELECT pg_advisory_unlock(%s)", (outbox_queries.RELAY_LOCK_KEY,))
        cli.join(120)
    normal = done["result"]
    assert normal.returncode == 0, (normal.stdout, normal.stderr)  # type: ignore[attr-defined]
    assert json.loads(normal.stdout)["unpublished_of_run"] == 0  # type: ignore[attr-defined]
    assert all(o["published_at"] is not None for o in outbox_rows(engine))  # the first 3 too


def test_a_run_that_cannot_publish_records_a_warning(engine, database_url, kafka_settings):
    bulk_due(engine, 2)
    with instance_for_test(overrides=instance_overrides()) as instance:
        with relay_lock_held(database_url):
            result = reminder_dispatch.execute_in_process(
                instance=instance,
                resources=resources_for(database_url, kafka_settings),
                run_config={"budget_seconds": 1},
            )
        assert result.success  # a warning, not a failed run: the rows were dispatched
        (materialization,) = result.asset_materializations_for_node("relay_outbox")
        meta = metadata_values(materialization)
        assert meta["partial_publish"] is True and meta["unpublished_of_run"] == 2
        assert meta["relay_lock_holder"].startswith("pid ")
        assert any("partial publish" in line for line in log_messages(instance, result.run_id))
        by_name = {e.check_name: e for e in result.get_asset_check_evaluations()}
        backlog = by_name["outbox_backlog"]
        assert not backlog.passed and backlog.severity is AssetCheckSeverity.WARN
        assert backlog.description is not None
        assert backlog.description.startswith(
            "This run left 2 of its outbox message(s) unpublished (relay lock held by pid "
        )
