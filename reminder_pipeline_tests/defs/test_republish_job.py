"""The ``reminder_republish`` job executed in process for one partition, on the real database and broker.

A day's published messages go out again and the partition of ``calendar/reminder_due_republished``
records how many; the run's log names the run, the back-fill and the user from the run's tags; a
day past the configured retention fails the run with the one-line refusal and no materialization.
Its definition: one partition per day that can be re-published (the sensor
``reminder_republish_days`` adds a day with sends and removes one past the retention or purged),
its own concurrency tag (never the dispatch one), limited to one run at a time in the shipped
instance config.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
import yaml
from dagster import (
    AddDynamicPartitionsRequest,
    DagsterInstance,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    build_sensor_context,
    instance_for_test,
)

from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.jobs import CONCURRENCY_TAG, CONCURRENCY_VALUE
from reminder_pipeline.defs.republish import (
    REPUBLISH_ASSET_KEY,
    REPUBLISH_CONCURRENCY_VALUE,
    REPUBLISH_JOB_NAME,
    REPUBLISH_PARTITIONS_NAME,
    reminder_republish,
    reminder_republish_days,
)
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.local.dagster_processes import INSTANCE_YAML
from reminder_pipeline.operator_jobs.republish import HEADER_REPUBLISHED_BY_RUN
from reminder_pipeline_tests.support import (
    outbox_rows,
    publish_two_days,
    utcnow,
    wait_for_republished,
)

from .helpers import (
    instance_overrides,
    log_messages,
    materializations,
    metadata_values,
    resources_for,
)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A throwaway instance with the shipped python_logs settings."""
    with instance_for_test(overrides=instance_overrides()) as instance:
        yield instance


def listed(instance: DagsterInstance, day: str) -> str:
    """``day`` as a partition of the back-fill (what the sensor does for a day with sends)."""
    instance.add_dynamic_partitions(REPUBLISH_PARTITIONS_NAME, [day])
    return day


def test_one_partition_republishes_its_day_and_records_the_count(
    database_url, engine, publisher, kafka_settings, kafka_reader, instance
):
    days = publish_two_days(engine, publisher, utcnow())
    day = days.days[1]
    before = [(r["id"], r["published_at"]) for r in outbox_rows(engine)]
    result = reminder_republish.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        partition_key=listed(instance, day.isoformat()),
        tags={"dagster/backfill": "bf-test", "user": "operator@example.com"},
    )
    assert result.success
    [materialization] = materializations(result.all_events)
    assert materialization.asset_key == REPUBLISH_ASSET_KEY
    assert materialization.partition == day.isoformat()
    values = metadata_values(materialization)
    assert values["republished_count"] == len(days.published[day]) == 5
    assert values["unpublished_count"] == 0
    assert values["backfill_id"] == "bf-test"
    sent = wait_for_republished(kafka_reader, days.published[day], 5)
    assert {m.headers[HEADER_REPUBLISHED_BY_RUN] for m in sent} == {result.run_id}
    assert sorted(m.value["ReminderId"] for m in sent) == sorted(days.published[day])
    assert [(r["id"], r["published_at"]) for r in outbox_rows(engine)] == before
    # Who, what, when: in the run's event log, ids only.
    [done] = [m for m in log_messages(instance, result.run_id) if "republish completed" in m]
    for part in (
        f"run_id={result.run_id}",
        "backfill_id=bf-test",
        "user=operator@example.com",
        f"day={day}",
        "republished=5",
    ):
        assert part in done


def test_a_partition_past_the_retention_fails_with_the_refusal(
    database_url, engine, publisher, kafka_settings, kafka_reader, instance
):
    days = publish_two_days(engine, publisher, utcnow())
    day = days.days[0]
    result = reminder_republish.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        partition_key=listed(instance, day.isoformat()),
        run_config={"ops": {"republish_day": {"config": {"retention_hours": 24}}}},
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith(
        f"re-publish of {day} refused: the day is past the outbox retention (24 h)"
    )
    assert "\n" not in description
    assert not materializations(result.all_events)
    assert not wait_for_republished(kafka_reader, days.published[day], 1, timeout=1.0)


def test_the_job_has_a_partition_per_republishable_day_and_never_blocks_a_cycle():
    job = defs.get_job_def(REPUBLISH_JOB_NAME)
    partitions = job.partitions_def
    assert isinstance(partitions, DynamicPartitionsDefinition)
    assert partitions.name == REPUBLISH_PARTITIONS_NAME
    assert job.tags[CONCURRENCY_TAG] == REPUBLISH_CONCURRENCY_VALUE != CONCURRENCY_VALUE
    assert int(job.tags["dagster/max_runtime"]) > 300
    limits = yaml.safe_load(INSTANCE_YAML.read_text())["concurrency"]["runs"][
        "tag_concurrency_limits"
    ]
    assert {"key": CONCURRENCY_TAG, "value": REPUBLISH_CONCURRENCY_VALUE, "limit": 1} in limits
    asset = defs.resolve_asset_graph().get(REPUBLISH_ASSET_KEY)
    assert asset.partitions_def == partitions


def test_a_bad_config_value_is_refused_in_one_line_before_anything_is_read(
    database_url, kafka_settings, instance
):
    result = reminder_republish.execute_in_process(
        instance=instance,
        resources=resources_for(database_url, kafka_settings),
        partition_key=listed(instance, utcnow().date().isoformat()),
        run_config={"ops": {"republish_day": {"config": {"chunk_size": 0}}}},
        raise_on_error=False,
    )
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_failure_data.user_failure_data.description == (
        "reminder_republish run config refused: chunk_size=0 is out of range [1, 10000]"
    )
    assert not [m for m in log_messages(instance, result.run_id) if "republish" in m]


def test_the_sensor_lists_the_days_with_sends_and_drops_a_purged_one(
    database_url, engine, publisher, instance
):
    """Days before any send are not listed (no "missing" day the job would refuse); a day whose
    outbox rows were purged in part leaves the list."""
    days = publish_two_days(engine, publisher, utcnow())

    def tick() -> list:
        with build_sensor_context(
            instance=instance, resources={"postgres": PostgresResource(database_url=database_url)}
        ) as context:
            result = reminder_republish_days(context)
        assert not result.run_requests
        for request in result.dynamic_partitions_requests:
            if isinstance(request, AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(request.partitions_def_name, key)
        return result.dynamic_partitions_requests

    [added] = tick()
    before = days.days[0] - timedelta(days=1)  # the helper's one reminder due the day before
    expected = [d.isoformat() for d in (before, *days.days)]
    assert isinstance(added, AddDynamicPartitionsRequest) and added.partition_keys == expected
    assert instance.get_dynamic_partitions(REPUBLISH_PARTITIONS_NAME) == expected
    assert tick() == []  # nothing new

    purged = next(r for r in outbox_rows(engine) if r["due_at"].date() == days.days[0])
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM outbox WHERE id = :id"), {"id": purged["id"]})
    [removed] = tick()
    assert isinstance(removed, DeleteDynamicPartitionsRequest)
    assert removed.partition_keys == [days.days[0].isoformat()]
