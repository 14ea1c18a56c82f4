"""The dispatch job in a long-lived process works again after PostgreSQL restarts, without a restart.

A PostgreSQL server of the test's own holds both the calendar database and Dagster's storage (as
``reminder-pipeline up`` lays them out). ``reminder_dispatch`` runs in process on the real
resources and broker, the server is restarted (fast, and immediate: every server process ended at
once, as in a crash) with this process and its resource definitions still alive, and the next run
sends and publishes the reminders that fell due meanwhile, once each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test

from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_tests.support import make_due_event, outbox_rows, reminders

from .helpers import instance_overrides, resources_for

pytestmark = pytest.mark.server


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL server of this test's own (to restart), with a migrated calendar database."""
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port())
    server.start()
    url = server.ensure_database("calendar")
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    yield server, url
    server.stop()


@pytest.fixture
def instance(own_postgres, tmp_path: Path) -> Iterator[DagsterInstance]:
    """Dagster's storage on the same server, as ``up`` keeps it."""
    server, _ = own_postgres
    storage = orchestrator.ensure_database(server.url("postgres"), "dagster")
    overrides = {**instance_overrides(), "storage": {"postgres": {"postgres_url": storage}}}
    home = tmp_path / "dagster_home"
    home.mkdir()
    with instance_for_test(temp_dir=str(home), overrides=overrides) as inst:
        yield inst


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_next_run_works_after_postgres_restarts_in_the_same_process(
    own_postgres, instance, kafka_settings, kafka_reader, mode
):
    server, url = own_postgres
    engine = make_engine(url)
    resources = resources_for(url, kafka_settings)
    try:
        first = make_due_event(engine, minutes_overdue=2)
        assert reminder_dispatch.execute_in_process(instance=instance, resources=resources).success

        server.stop(mode=mode)
        server.start()
        second = make_due_event(engine, minutes_overdue=1)  # the test's own pool heals too

        result = reminder_dispatch.execute_in_process(instance=instance, resources=resources)
        assert result.success
        assert result.output_for_node("relay_outbox").counts.published == 1
        ids = [reminders(engine, e)[0]["id"] for e in (first, second)]
        assert all(o["published_at"] is not None for o in outbox_rows(engine))
        messages = kafka_reader.wait_for(ids)
        assert Counter(m.value["ReminderId"] for m in messages) == Counter(map(str, ids))
    finally:
        engine.dispose()
