"""Dagster run retention on a real instance: PostgreSQL storage (as in production) and a real
``DAGSTER_HOME`` with step outputs (``fs_io_manager`` pickles) and compute logs on disk.

Checked: old finished runs go with their event log, run directory and compute logs; recent runs,
runs in flight, a run group whose re-execution is in flight or with a run younger than the
retention, the runs of a back-fill not finished and the retention run itself stay (what is in
use read again before each delete); a run whose files cannot be deleted (a symbolic link, a file
where its directory should be) is kept, counted and logged, and the pass goes on;
batches go oldest first and a pass stopped by its budget is resumed by the next; the job and its
daily schedule are in the definitions, with config refused in one line; the shipped instance
config bounds schedule and sensor ticks.

Runs are made old by moving ``runs.create_timestamp`` back with SQL on Dagster's own table (there
is no public API to create a run in the past); this is done here, in tests only.
"""

from __future__ import annotations

import itertools
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import (
    DagsterInstance,
    DagsterInvalidConfigError,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    FilesystemIOManager,
    RunRequest,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
    job,
    op,
    validate_run_config,
)
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from reminder_pipeline.config import libpq_url
from reminder_pipeline.definitions import defs
from reminder_pipeline.defs import run_retention_pass
from reminder_pipeline.defs.resources import PostgresResource
from reminder_pipeline.defs.run_retention import (
    RUN_RETENTION_JOB_NAME,
    RUN_RETENTION_MAX_BUDGET_SECONDS,
    RUN_RETENTION_MAX_RUNTIME_SECONDS,
    dagster_run_retention,
    dagster_run_retention_schedule,
)
from reminder_pipeline.defs.sensors import reminder_health_sensor
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.logs import fields_of

from .helpers import instance_overrides, log_messages

KEEP = timedelta(days=14)
OLD = timedelta(days=15)
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


@op
def produce() -> int:
    """Prints (a compute log) and returns (a pickled step output)."""
    print("produce: one line for the compute log")  # the captured stdout is the point
    return 1


@op
def consume(value: int) -> int:
    """Loads the first step's output from storage."""
    return value + 1


@op
def explode(value: int) -> int:
    """Fails after its input was loaded: a failed run that still has files."""
    raise RuntimeError(f"failing on purpose with {value}")


@job(resource_defs={"io_manager": FilesystemIOManager()})
def tiny():
    """Two steps whose outputs go to the instance's storage directory."""
    consume(produce())


@job(resource_defs={"io_manager": FilesystemIOManager()})
def tiny_failing():
    """Two steps, the second fails."""
    explode(produce())


@pytest.fixture
def instance(dagster_storage_url: str, tmp_path: Path) -> Iterator[DagsterInstance]:
    """An instance on PostgreSQL storage with a persistent DAGSTER_HOME (storage dir on disk)."""
    overrides = {
        **instance_overrides(),
        "storage": {"postgres": {"postgres_url": dagster_storage_url}},
    }
    home = tmp_path / "dagster_home"
    home.mkdir()
    with instance_for_test(temp_dir=str(home), overrides=overrides) as inst:
        yield inst


def backdate(dagster_storage_url: str, run_ids: list[str], by: timedelta) -> None:
    """Move runs' creation time back (SQL on Dagster's runs table: tests only, no public API)."""
    # libpq's form: SQLAlchemy would write the bounds' options with "+" for spaces.
    with psycopg.connect(libpq_url(dagster_storage_url), autocommit=True) as conn:
        conn.execute(
            "UPDATE runs SET create_timestamp = create_timestamp - %s WHERE run_id = ANY(%s)",
            (by, run_ids),
        )


def GROUP_TAGS(root: str) -> dict[str, str]:
    """The tags Dagster gives a re-execution of ``root`` (what its run group is read by)."""
    return {"dagster/root_run_id": root, "dagster/parent_run_id": root}


def run_dir(instance: DagsterInstance, run_id: str) -> Path:
    return Path(instance.storage_directory()) / run_id


def executed(instance: DagsterInstance, job_def=tiny) -> str:
    """A finished run with its event log, step outputs and compute logs; its id."""
    result = job_def.execute_in_process(instance=instance, raise_on_error=False)
    return result.run_id


def in_flight_run(instance: DagsterInstance, status: DagsterRunStatus, **kwargs) -> str:
    """A run in ``status`` with a file in its directory (what a step would be writing)."""
    # A queued run must say where its code is (the daemon launches it from there).
    origin = (
        RemoteJobOrigin(
            repository_origin=RemoteRepositoryOrigin(
                code_location_origin=InProcessCodeLocationOrigin(
                    LoadableTargetOrigin(python_file=__file__)
                ),
                repository_name="__repository__",
            ),
            job_name=tiny.name,
        )
        if status is DagsterRunStatus.QUEUED
        else None
    )
    run = instance.add_run(
        DagsterRun(
            job_name=tiny.name,
            run_id=str(uuid.uuid4()),
            status=status,
            remote_job_origin=origin,
            **kwargs,
        )
    )
    directory = run_dir(instance, run.run_id)
    directory.mkdir(parents=True)
    (directory / "in-progress").write_text("a step output being written")
    return run.run_id


def canceled_run(instance: DagsterInstance) -> str:
    """A run canceled before it started: an event log, no files."""
    run = instance.create_run_for_job(tiny, status=DagsterRunStatus.NOT_STARTED)
    instance.report_run_canceled(run, message="canceled before it started")
    assert instance.get_run_by_id(run.run_id).status is DagsterRunStatus.CANCELED
    return run.run_id


def assert_gone(instance: DagsterInstance, run_id: str) -> None:
    assert instance.get_run_by_id(run_id) is None
    assert instance.all_logs(run_id) == []
    assert not run_dir(instance, run_id).exists()


def assert_kept(instance: DagsterInstance, run_id: str) -> None:
    assert instance.get_run_by_id(run_id) is not None
    assert run_dir(instance, run_id).is_dir()


def test_old_finished_runs_go_with_their_event_logs_outputs_and_compute_logs(
    instance, dagster_storage_url
):
    success = executed(instance)
    failure = executed(instance, tiny_failing)
    canceled = canceled_run(instance)
    in_flight = {status: in_flight_run(instance, status) for status in IN_FLIGHT}
    backdate(dagster_storage_url, [success, failure, canceled, *in_flight.values()], OLD)
    recent = executed(instance)

    assert instance.get_run_by_id(success).status is DagsterRunStatus.SUCCESS
    assert instance.get_run_by_id(failure).status is DagsterRunStatus.FAILURE
    for run_id in (success, failure):
        # What retention is for: the pickled step output and the captured logs on disk.
        assert (run_dir(instance, run_id) / "produce" / "result").is_file()
        assert any(run_dir(instance, run_id).glob("compute_logs/*.out"))
        assert instance.all_logs(run_id)
    assert instance.all_logs(canceled)
    expected_bytes = sum(
        run_retention_pass.tree_bytes(run_dir(instance, r)) for r in (success, failure)
    )
    assert expected_bytes > 0

    report = run_retention_pass.purge_runs(instance, KEEP)

    for run_id in (success, failure, canceled):
        assert_gone(instance, run_id)
    assert_kept(instance, recent)
    assert instance.all_logs(recent)
    for status, run_id in in_flight.items():
        assert instance.get_run_by_id(run_id).status is status
        assert (run_dir(instance, run_id) / "in-progress").is_file()
    assert (report.runs_deleted, report.directories_removed) == (3, 2)
    assert report.bytes_removed == expected_bytes
    assert (report.runs_kept_in_use, report.left_for_next_time, report.budget_exhausted) == (
        0,
        0,
        False,
    )
    # A second pass finds nothing more to do.
    assert run_retention_pass.purge_runs(instance, KEEP).runs_deleted == 0
    assert_kept(instance, recent)


def test_the_retention_run_never_deletes_itself(instance, dagster_storage_url):
    itself = executed(instance)
    other = executed(instance)
    backdate(dagster_storage_url, [itself, other], OLD)

    report = run_retention_pass.purge_runs(instance, KEEP, own_run_id=itself)

    assert_kept(instance, itself)
    assert_gone(instance, other)
    assert (report.runs_deleted, report.runs_kept_in_use, report.left_for_next_time) == (1, 1, 1)


def test_a_run_group_stays_while_its_re_execution_is_in_flight(instance, dagster_storage_url):
    parent = executed(instance)
    sibling = instance.create_run_for_job(
        tiny,
        status=DagsterRunStatus.SUCCESS,
        parent_run_id=parent,
        root_run_id=parent,
        tags=GROUP_TAGS(parent),
    ).run_id
    backdate(dagster_storage_url, [parent, sibling], OLD)
    # A re-execution from failure loads the parent's step outputs from the parent's directory.
    reexecution = in_flight_run(
        instance,
        DagsterRunStatus.STARTED,
        parent_run_id=parent,
        root_run_id=parent,
        tags=GROUP_TAGS(parent),
    )

    report = run_retention_pass.purge_runs(instance, KEEP)

    assert_kept(instance, parent)
    assert instance.get_run_by_id(sibling) is not None
    assert (report.runs_deleted, report.runs_kept_in_use, report.left_for_next_time) == (0, 2, 2)

    # Ended, but younger than the retention: the group may be re-executed again from its runs.
    instance.report_run_failed(instance.get_run_by_id(reexecution), "the re-execution ended")
    report = run_retention_pass.purge_runs(instance, KEEP)

    assert_kept(instance, parent)
    assert instance.get_run_by_id(sibling) is not None
    assert (report.runs_deleted, report.runs_kept_group_recent) == (0, 2)

    backdate(dagster_storage_url, [reexecution], OLD)
    report = run_retention_pass.purge_runs(instance, KEEP)

    assert_gone(instance, parent)
    assert instance.get_run_by_id(sibling) is None
    assert instance.get_run_by_id(reexecution) is None
    assert (report.runs_deleted, report.left_for_next_time) == (3, 0)


def test_batches_go_oldest_first_and_a_pass_stopped_by_its_budget_is_resumed(
    instance, dagster_storage_url
):
    runs = [executed(instance) for _ in range(7)]
    backdate(dagster_storage_url, runs, OLD)
    selection = run_retention_pass.old_finished_runs(run_retention_pass.cutoff_for(KEEP))

    def deletions_so_far() -> float:
        """A clock that advances one "second" per run deleted: the budget counts deletions."""
        return float(len(runs) - instance.get_runs_count(selection))

    first = run_retention_pass.purge_runs(
        instance, KEEP, batch_size=2, budget_seconds=3, clock=deletions_so_far
    )
    assert (first.runs_deleted, first.left_for_next_time, first.budget_exhausted) == (3, 4, True)
    # Oldest first: the first three created are the ones gone.
    assert [instance.get_run_by_id(r) is None for r in runs] == [True] * 3 + [False] * 4

    start = deletions_so_far()
    second = run_retention_pass.purge_runs(
        instance, KEEP, batch_size=2, budget_seconds=3, clock=lambda: deletions_so_far() - start
    )
    assert (second.runs_deleted, second.left_for_next_time, second.budget_exhausted) == (3, 1, True)

    last = run_retention_pass.purge_runs(instance, KEEP, batch_size=2)
    assert (last.runs_deleted, last.left_for_next_time, last.budget_exhausted) == (1, 0, False)
    assert all(instance.get_run_by_id(r) is None for r in runs)
    assert not any(run_dir(instance, r).exists() for r in runs)


def test_small_batches_cover_every_old_run(instance, dagster_storage_url):
    runs = [executed(instance) for _ in range(5)]
    backdate(dagster_storage_url, runs, OLD)

    report = run_retention_pass.purge_runs(instance, KEEP, batch_size=2)

    assert (report.runs_deleted, report.batches, report.directories_removed) == (5, 3, 5)


def test_the_job_records_its_counts_and_survives_its_own_pass(instance, dagster_storage_url):
    old = [executed(instance) for _ in range(2)]
    backdate(dagster_storage_url, old, OLD)
    recent = executed(instance)

    result = dagster_run_retention.execute_in_process(
        instance=instance, run_config={"keep_days": 14, "batch_size": 1}
    )

    assert result.success
    [output] = [e for e in result.all_events if e.is_successful_output]
    metadata = {k: v.value for k, v in output.event_specific_data.metadata.items()}
    assert metadata["runs_deleted"] == 2
    assert metadata["directories_removed"] == 2
    assert metadata["bytes_removed"] > 0
    assert metadata["left_for_next_time"] == 0
    assert metadata["batches"] == 2  # one run each (the empty look-up after them is not a batch)
    assert metadata["keep_days"] == 14
    assert metadata["duration_seconds"] >= 0
    assert all(instance.get_run_by_id(r) is None for r in old)
    assert_kept(instance, recent)
    assert instance.get_run_by_id(result.run_id).status is DagsterRunStatus.SUCCESS
    [line] = [
        m for m in log_messages(instance, result.run_id) if m.startswith("dagster runs purged")
    ]
    assert f"run_id={result.run_id}" in line and "runs_deleted=2" in line
    assert "left_for_next_time=0" in line and "bytes_removed=" in line


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"keep_days": 0}, "keep_days=0 is out of range [1, 365]"),
        ({"keep_days": 366}, "keep_days=366 is out of range [1, 365]"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"budget_seconds": RUN_RETENTION_MAX_BUDGET_SECONDS + 1}, "budget_seconds="),
    ],
)
def test_bad_run_config_is_refused_in_one_line_before_a_run_exists(config, fragment):
    with pytest.raises(DagsterInvalidConfigError) as refused:
        validate_run_config(dagster_run_retention, config)
    message = str(refused.value).splitlines()[0]
    assert message.startswith(f"{RUN_RETENTION_JOB_NAME} run config refused: ")
    assert fragment in message


def test_a_non_integer_keep_days_is_refused():
    with pytest.raises(DagsterInvalidConfigError):
        validate_run_config(dagster_run_retention, {"keep_days": "lots"})


def test_the_job_and_its_daily_schedule_are_in_the_definitions():
    repo = defs.get_repository_def()
    assert repo.get_job(RUN_RETENTION_JOB_NAME) is not None
    schedule = repo.get_schedule_def("dagster_run_retention_schedule")
    assert schedule.job_name == RUN_RETENTION_JOB_NAME
    assert schedule.default_status is DefaultScheduleStatus.RUNNING
    minute, hour, *every_day = schedule.cron_schedule.split()
    assert every_day == ["*", "*", "*"] and minute.isdigit() and hour.isdigit()
    assert int(minute) not in (0, 30)  # off the hour, when other cron jobs pile up
    assert schedule.execution_timezone == "UTC"
    # The run stops on its own budget before run monitoring would fail it.
    max_runtime = int(dagster_run_retention.tags["dagster/max_runtime"])
    assert max_runtime == RUN_RETENTION_MAX_RUNTIME_SECONDS > RUN_RETENTION_MAX_BUDGET_SECONDS
    assert validate_run_config(dagster_run_retention, {})["ops"]["delete_old_runs"]["config"] == {
        "keep_days": 14,
        "batch_size": run_retention_pass.RUN_RETENTION_BATCH_SIZE,
        "budget_seconds": run_retention_pass.RUN_RETENTION_BUDGET_SECONDS,
    }


def test_the_schedule_skips_a_tick_while_a_retention_run_is_in_flight(instance):
    tick = datetime(2026, 11, 30, 2, 43, tzinfo=UTC)
    request = dagster_run_retention_schedule(
        build_schedule_context(instance=instance, scheduled_execution_time=tick)
    )
    assert isinstance(request, RunRequest)

    running = instance.create_run_for_job(dagster_run_retention, status=DagsterRunStatus.STARTED)
    skipped = dagster_run_retention_schedule(
        build_schedule_context(instance=instance, scheduled_execution_time=tick)
    )
    assert isinstance(skipped, SkipReason)
    assert running.run_id in skipped.skip_message


def test_the_shipped_instance_config_bounds_schedule_and_sensor_ticks():
    # The health sensor ticks every minute (1,440 ticks a day), the failure sensor every 30 s:
    # Dagster keeps finished sensor ticks forever unless the instance says otherwise.
    shipped = yaml.safe_load(orchestrator.INSTANCE_YAML.read_text())["retention"]
    with instance_for_test(overrides={"retention": shipped}) as instance:
        for kind in (InstigatorType.SCHEDULE, InstigatorType.SENSOR):
            days = instance.get_tick_retention_settings(kind)
            for status in (TickStatus.SKIPPED, TickStatus.SUCCESS, TickStatus.FAILURE):
                assert 0 < days[status] <= 31, (kind, status, days[status])


def test_progress_is_reported_while_a_long_pass_runs(instance, dagster_storage_url):
    runs = [executed(instance) for _ in range(3)]
    backdate(dagster_storage_url, runs, OLD)
    # Every clock reading is 100 s after the one before: more than a minute passes each time.
    ticks = itertools.count(step=100)
    reported: list[dict] = []

    report = run_retention_pass.purge_runs(
        instance,
        KEEP,
        batch_size=1,
        budget_seconds=10_000,
        clock=lambda: float(next(ticks)),
        on_progress=reported.append,
    )

    assert report.runs_deleted == 3 and not report.budget_exhausted
    assert reported, "no progress reported"
    deleted = [r["runs_deleted"] for r in reported]
    assert deleted == sorted(deleted) and deleted[0] >= 1 and deleted[-1] <= 3


def test_the_health_sensor_leaves_no_log_file_per_tick(instance, database_url):
    # Dagster purges old ticks (retention.sensor) but never their captured log files: a log line
    # per evaluation would leave a file a minute under storage/ for good.
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        repository_name="__repository__",
        sensor_name="reminder_health_sensor",
        resources={"postgres": PostgresResource(database_url=database_url)},
    ) as context:
        result = reminder_health_sensor(context)
        assert not context.has_captured_logs()
    assert "health checks evaluated" in result.skip_reason.skip_message  # the verdict, on the tick
    storage = Path(instance.storage_directory())
    assert not [p for p in storage.rglob("*") if p.is_file()]


def test_a_run_whose_files_cannot_be_deleted_is_skipped_counted_and_the_pass_goes_on(
    instance, dagster_storage_url, tmp_path, caplog
):
    linked, blocked, plain = (executed(instance) for _ in range(3))
    backdate(dagster_storage_url, [linked, blocked, plain], OLD)
    # What stops even root: a symbolic link where the run's directory was (rmtree refuses to
    # follow one), and a file where a directory is expected.
    elsewhere = tmp_path / "elsewhere"
    run_dir(instance, linked).rename(elsewhere)
    run_dir(instance, linked).symlink_to(elsewhere, target_is_directory=True)
    shutil.rmtree(run_dir(instance, blocked))
    run_dir(instance, blocked).write_text("not a directory")
    caplog.set_level("WARNING")

    report = run_retention_pass.purge_runs(instance, KEEP, batch_size=1)

    assert_gone(instance, plain)
    for run_id in (linked, blocked):
        assert instance.get_run_by_id(run_id) is not None  # kept whole, found next time
    assert (elsewhere / "produce" / "result").is_file()  # nothing followed through the link
    assert (report.runs_deleted, report.runs_undeletable, report.left_for_next_time) == (1, 2, 2)
    warned = [
        r for r in caplog.records if r.getMessage() == "dagster run files not deletable; run kept"
    ]
    assert {fields_of(r)["kept_run_id"] for r in warned} == {linked, blocked}
    # The next pass does not stall on them either.
    newer = executed(instance)
    backdate(dagster_storage_url, [newer], OLD)
    again = run_retention_pass.purge_runs(instance, KEEP)
    assert (again.runs_deleted, again.runs_undeletable) == (1, 2)
    assert_gone(instance, newer)


def test_the_runs_of_a_back_fill_that_has_not_finished_are_kept(instance, dagster_storage_url):
    backfill_id = "bf" + uuid.uuid4().hex[:6]
    instance.add_backfill(
        PartitionBackfill(
            backfill_id=backfill_id,
            status=BulkActionStatus.REQUESTED,
            from_failure=False,
            tags={},
            backfill_timestamp=datetime.now(UTC).timestamp(),
            partition_names=["2026-11-20", "2026-11-21"],
        )
    )
    days = [
        instance.create_run_for_job(
            tiny, status=DagsterRunStatus.SUCCESS, tags={"dagster/backfill": backfill_id}
        ).run_id
        for _ in range(2)
    ]
    other = executed(instance)
    backdate(dagster_storage_url, [*days, other], OLD)

    report = run_retention_pass.purge_runs(instance, KEEP)

    assert all(instance.get_run_by_id(r) is not None for r in days)
    assert_gone(instance, other)
    assert (report.runs_deleted, report.runs_kept_backfill) == (1, 2)

    backfill = instance.get_backfill(backfill_id)
    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    report = run_retention_pass.purge_runs(instance, KEEP)

    assert all(instance.get_run_by_id(r) is None for r in days)
    assert (report.runs_deleted, report.runs_kept_backfill) == (2, 0)


def test_the_runs_in_use_are_read_just_before_each_delete(instance, dagster_storage_url):
    first, parent = executed(instance), executed(instance)
    backdate(dagster_storage_url, [first, parent], OLD)
    started: list[str] = []

    def clock() -> float:
        """Starts a re-execution of ``parent`` mid-batch, once ``first`` is gone."""
        if not started and instance.get_run_by_id(first) is None:
            started.append(
                in_flight_run(
                    instance,
                    DagsterRunStatus.STARTED,
                    parent_run_id=parent,
                    root_run_id=parent,
                    tags=GROUP_TAGS(parent),
                )
            )
        return 0.0

    report = run_retention_pass.purge_runs(instance, KEEP, batch_size=10, clock=clock)

    assert started
    assert_gone(instance, first)
    assert_kept(instance, parent)
    assert (report.runs_deleted, report.runs_kept_in_use) == (1, 1)
