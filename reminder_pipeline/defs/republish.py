"""The re-publish back-fill ``reminder_republish``: a run per DueAt day, picked in the UI.

A partitioned op job (dynamic partitions: the UTC DueAt days that can be re-published, kept by
the sensor ``reminder_republish_days``) whose one op calls
:func:`reminder_pipeline.operator_jobs.republish.resend_day` and records a materialization of
the partition
of ``calendar/reminder_due_republished`` with the day's counts. An op job rather than an
``@asset``: a back-fill launched from an asset's page runs Dagster's implicit asset job, which
carries none of a job's tags, so the concurrency limit and the max runtime below would not hold;
here the job is the only way to launch it (its *Partitions* tab → *Launch backfill*, or the
Launchpad for one day), and the asset shows which days were re-published.

Runs carry ``reminder_pipeline/concurrency=republish`` (never ``dispatch``: a back-fill must not
hold up the schedule), limited to one at a time in ``dagster.yaml``: the days of a back-fill then
go out one after another in order (a key's reminders can fall on two days, e.g. offsets of a day
and an hour), and a live relay waiting for the advisory lock waits behind one chunk at most.
"""

# No ``from __future__ import annotations``: Dagster reads the op's annotations at definition time.

from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Annotated, Any

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    Config,
    DagsterInvalidConfigError,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    Failure,
    MetadataValue,
    OpExecutionContext,
    SensorEvaluationContext,
    SensorResult,
    in_process_executor,
    job,
    op,
    sensor,
)
from pydantic import Field

from ..config import DEFAULT_RETENTION_HOURS, check_int, check_number, check_retention_hours
from ..domain import contract
from ..logs import FoldingJournal
from ..operator_jobs import republish
from .jobs import KIND_TAG
from .limits import CONCURRENCY_TAG, refuse_overridden_limits
from .resources import KafkaResource, PostgresResource
from .run_config import checked, checked_by

#: Run tags Dagster sets (documented tag names; no public constant for them).
BACKFILL_ID_TAG = "dagster/backfill"
USER_TAG = "user"

REPUBLISH_JOB_NAME = "reminder_republish"
REPUBLISH_ASSET_KEY = AssetKey(["calendar", "reminder_due_republished"])
REPUBLISH_CONCURRENCY_VALUE = "republish"
#: A large day (100k messages) takes well under a minute; the rest is room for waiting on the
#: relay lock behind a catch-up drain (up to 240 s) and for a slow broker.
REPUBLISH_MAX_RUNTIME_SECONDS = 30 * 60

#: One partition per UTC DueAt day that can be re-published, as ``reminder_republish_days``
#: finds them: days with sends whose outbox rows are all still there, inside the retention. Days
#: before the install, without sends, or purged are not listed at all (a fixed daily calendar
#: would list them as "missing" and the job would refuse them).
REPUBLISH_PARTITIONS_NAME = "reminder_republish_days"
republish_partitions = DynamicPartitionsDefinition(name=REPUBLISH_PARTITIONS_NAME)
#: How often the days are refreshed: a day appears within this after its first send.
DAYS_INTERVAL_SECONDS = 300

#: What the UI's "missing" partitions mean here, said where an operator reads it (the asset's and
#: the job's descriptions).
MISSING_MEANS = (
    "Its partitions are the days that can be re-published (sends, all their outbox rows still "
    "there, inside the 168 h retention), refreshed every 5 minutes by the sensor "
    'reminder_republish_days; "missing" means not re-published yet, the normal state.'
)

reminder_due_republished = AssetSpec(
    key=REPUBLISH_ASSET_KEY,
    description=(
        "Per DueAt day (UTC): the already published ReminderDueEvents of that day re-published "
        f"from the outbox to {contract.TOPIC} for a consumer that lost them (consumers "
        "de-duplicate by ReminderId). Materialized by the job reminder_republish, one "
        "partition per day; republished_count says how many went out. " + MISSING_MEANS
    ),
    group_name="calendar",
    kinds={"postgres", "kafka"},
    partitions_def=republish_partitions,
    metadata={
        "topic": contract.TOPIC,
        "job": REPUBLISH_JOB_NAME,
        "header": republish.HEADER_REPUBLISHED_BY_RUN,
    },
)


class RepublishConfig(Config):
    """How far back days may go, and how the day is sent (the defaults suit a back-fill)."""

    retention_hours: Annotated[float, checked_by(check_retention_hours)] = Field(
        default=DEFAULT_RETENTION_HOURS,
        description="The outbox retention outbox_retention applies "
        "(default 168): older days are refused.",
    )
    chunk_size: Annotated[
        int, checked_by(partial(check_int, name="chunk_size", low=1, high=republish.MAX_CHUNK_SIZE))
    ] = Field(
        default=republish.DEFAULT_CHUNK_SIZE,
        description="Messages per chunk (the relay lock is held per chunk).",
    )
    lock_wait_seconds: Annotated[
        float,
        checked_by(
            partial(
                check_number,
                name="lock_wait_seconds",
                low=1.0,
                high=republish.MAX_LOCK_WAIT_SECONDS,
            )
        ),
    ] = Field(
        default=republish.DEFAULT_LOCK_WAIT_SECONDS,
        description="How long a chunk waits for the relay lock.",
    )


# A partitioned job cannot take the config mapping that checks the other jobs' config at launch,
# so the op takes RepublishConfig's schema and builds the class itself: a bad value then fails the
# step in the validators' one line, not in Dagster's traceback of a config class it could not build.
@op(
    description="Re-publish the day's already published outbox messages, in outbox id order.",
    config_schema=RepublishConfig.to_fields_dict(),
)
def republish_day(
    context: OpExecutionContext,
    postgres: PostgresResource,
    kafka: KafkaResource,
) -> None:
    """One partition (a UTC DueAt day): refused, failed plainly, or materialized with its counts."""
    refuse_overridden_limits(context)
    try:
        config = checked(REPUBLISH_JOB_NAME, RepublishConfig, context.op_config)
    except DagsterInvalidConfigError as refused:
        raise Failure(description=str(refused), allow_retries=False) from None
    day = date.fromisoformat(context.partition_key)
    tags = context.run.tags
    requester = republish.Requester(context.run_id, tags.get(BACKFILL_ID_TAG), tags.get(USER_TAG))
    keep = timedelta(hours=config.retention_hours)
    now = datetime.now(UTC)
    with FoldingJournal(context.log) as journal:  # who-what-when in the run's event log too
        try:
            republish.admit_day(day, requester, keep, now, journal)  # before touching the broker
        except republish.RepublishRefused as refused:
            raise Failure(description=str(refused), allow_retries=False) from None
        publisher = kafka.ready_publisher()
        if publisher is None:
            raise Failure(description=f"re-publish of {day}: {kafka.topic_error()}")
        try:
            report = republish.resend_day(
                postgres.engine,
                publisher,
                day,
                requester,
                retention=keep,
                now=now,
                chunk_size=config.chunk_size,
                lock_wait_seconds=config.lock_wait_seconds,
                journal=journal,
            )
        except republish.RepublishRefused as refused:  # e.g. the day's rows were purged in part
            raise Failure(description=str(refused), allow_retries=False) from None
        except republish.RepublishFailed as failed:
            raise Failure(
                description=str(failed), metadata={"republished_count": failed.republished}
            ) from None
    context.log_event(
        AssetMaterialization(
            asset_key=REPUBLISH_ASSET_KEY,
            partition=context.partition_key,
            description=f"{report.republished} messages due on {day} re-published",
            metadata=_republished_metadata(report, config, requester),
        )
    )


def _republished_metadata(
    report: republish.RepublishReport, config: RepublishConfig, requester: republish.Requester
) -> dict[str, MetadataValue[Any]]:
    """The day's counts on its materialization of ``calendar/reminder_due_republished``."""
    return {
        "republished_count": MetadataValue.int(report.republished),
        "unpublished_count": MetadataValue.int(report.unpublished),
        # Left out because they no longer hold (the event cancelled, moved, completed).
        "not_republished_count": MetadataValue.int(sum(report.not_republished.values())),
        **{
            f"not_republished_{reason}": MetadataValue.int(report.not_republished.get(reason, 0))
            for reason in republish.STALE_REASONS
        },
        "chunks": MetadataValue.int(report.chunks),
        "duration_ms": MetadataValue.int(report.duration_ms),
        "first_outbox_id": MetadataValue.int(report.first_outbox_id or 0),
        "last_outbox_id": MetadataValue.int(report.last_outbox_id or 0),
        "retention_hours": MetadataValue.float(float(config.retention_hours)),
        "backfill_id": MetadataValue.text(requester.backfill_id or ""),
    }


@job(
    name=REPUBLISH_JOB_NAME,
    description=(
        "Re-publish back-fill for a consumer that lost messages: pick DueAt days (UTC) on the "
        "Partitions tab and Launch backfill. Each day's already published messages go out again "
        "from the outbox, in outbox id order, exactly as stored plus a republished-by-run header "
        "(consumers de-duplicate by ReminderId). Days past the outbox retention (168 h) or in "
        "the future are refused; unpublished rows are left to the relay. To drain Pending "
        "reminders after an outage, use reminder_catch_up instead. " + MISSING_MEANS
    ),
    partitions_def=republish_partitions,
    executor_def=in_process_executor,
    tags={
        CONCURRENCY_TAG: REPUBLISH_CONCURRENCY_VALUE,
        KIND_TAG: "back-fill",
        "dagster/max_runtime": str(REPUBLISH_MAX_RUNTIME_SECONDS),
    },
)
def reminder_republish() -> None:
    """One step: the day's re-publish."""
    republish_day()


@sensor(
    name="reminder_republish_days",
    minimum_interval_seconds=DAYS_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Keeps the partitions of reminder_republish to the days that can be re-published: adds a "
        "day once it has sends, removes it once it is past the outbox retention (168 h) or its "
        "rows were purged in part. No run is launched."
    ),
)
def reminder_republish_days(
    context: SensorEvaluationContext, postgres: PostgresResource
) -> SensorResult:
    """The partitions brought in line with :func:`republish.republishable_days`."""
    wanted = [day.isoformat() for day in republish.republishable_days(postgres.engine)]
    listed = set(context.instance.get_dynamic_partitions(REPUBLISH_PARTITIONS_NAME))
    added = [day for day in wanted if day not in listed]
    gone = sorted(listed - set(wanted))
    requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
    if added:
        requests.append(AddDynamicPartitionsRequest(REPUBLISH_PARTITIONS_NAME, added))
    if gone:
        requests.append(DeleteDynamicPartitionsRequest(REPUBLISH_PARTITIONS_NAME, gone))
    return SensorResult(
        dynamic_partitions_requests=requests,
        skip_reason=f"days that can be re-published: {len(wanted)} "
        f"(added {', '.join(added) or 'none'}; removed {', '.join(gone) or 'none'})",
    )
