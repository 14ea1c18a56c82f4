"""Dagster run retention: finished runs older than a retention go, with everything they left behind.

A run every minute is 1,440 Dagster runs a day. Each leaves its row and tags and its event log in
Dagster's database, and its step outputs (the ``fs_io_manager`` pickles) and compute logs under
``<storage directory>/<run_id>/``. :func:`purge_runs` deletes the finished ones (success, failure,
canceled) created before a cutoff, oldest first, through Dagster's public API only:

* ``instance.get_run_records`` finds them, a small batch at a time;
* the compute log manager's ``delete_logs(prefix=[run_id])`` and the run's directory under
  ``instance.storage_directory()`` go first, so a stop in between leaves a run without files
  (found and finished next time), never files without a run (found by nothing);
* ``instance.delete_run`` deletes the run, its tags and its event log.

It never touches a run in flight (queued, starting, started, canceling: only finished statuses
are selected), the caller's own run, a run whose re-execution is in flight (that run loads its
inputs from the older runs' step outputs), any run of a run group with a run younger than the
retention (it may be re-executed again from them), nor a run of a back-fill that has not
finished (its days would show as missing again). What is in use is read again just before each
delete, not once per batch: a re-execution or back-fill may start meanwhile.

A run whose files cannot be deleted (a symbolic link, a file where its directory should be, an
immutable file) is kept whole, counted (``runs_undeletable``) and logged with its id at WARNING,
and the pass goes on: one bad run never stalls every later pass. It stops before its time budget,
with the count of what is left; the next call starts again from the oldest, so it resumes where
it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from ..logs import event
from ..store.engine import DAGSTER_STATEMENT_TIMEOUT_MS
from .limits import IN_FLIGHT_STATUSES

log = logging.getLogger(__name__)

DEFAULT_KEEP = timedelta(days=14)
RUN_RETENTION_BATCH_SIZE = 100
RUN_RETENTION_BUDGET_SECONDS = 1200.0
#: Only these are ever deleted: a run in any other status may still be running or be picked up.
FINISHED_STATUSES = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
_PROGRESS_EVERY_SECONDS = 60.0
#: Tags Dagster sets on runs (documented names; no public constant for them).
BACKFILL_TAG = "dagster/backfill"
ROOT_RUN_ID_TAG = "dagster/root_run_id"
#: A back-fill in one of these statuses is over (Dagster's BulkActionStatus values).
FINISHED_BACKFILL_STATUSES = frozenset(
    {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
)
#: Why an old finished run is kept (RetentionReport's runs_kept_* counts).
KEEP_REASONS = ("in_use", "backfill", "group_recent")
#: A report's field: plain values, which Dagster shows (and plots) as metadata of their own type.
MetadataScalar = int | float | bool | str


@dataclass(frozen=True)
class RetentionReport:
    """What one pass deleted and what it left for the next."""

    runs_deleted: int
    directories_removed: int
    bytes_removed: int
    #: Old and finished, but the caller's run or in the group of an in-flight re-execution.
    runs_kept_in_use: int
    #: Old finished runs still there (the budget ran out, or kept in use).
    left_for_next_time: int
    batches: int
    duration_seconds: float
    budget_exhausted: bool
    cutoff: datetime
    #: Old and finished, but a run of a back-fill that has not finished.
    runs_kept_backfill: int = 0
    #: Old and finished, but in a run group with a run younger than the retention.
    runs_kept_group_recent: int = 0
    #: Kept because their files could not be deleted (each logged with its run id).
    runs_undeletable: int = 0

    def fields(self) -> dict[str, MetadataScalar]:
        """The counts as flat log/metadata fields (the cutoff as ISO text)."""
        values = asdict(self)
        values["cutoff"] = self.cutoff.isoformat()
        values["duration_seconds"] = round(self.duration_seconds, 3)
        return values


def cutoff_for(keep: timedelta, now: datetime | None = None) -> datetime:
    """The creation time before which a finished run is deleted (UTC)."""
    return (now or datetime.now(UTC)).astimezone(UTC) - keep


def old_finished_runs(cutoff: datetime) -> RunsFilter:
    """The runs retention deletes: finished, created before ``cutoff``."""
    return RunsFilter(statuses=list(FINISHED_STATUSES), created_before=cutoff)


@dataclass
class _Tally:
    """What a pass has done so far (the counts of its :class:`RetentionReport`)."""

    deleted: int = 0
    directories: int = 0
    size: int = 0
    batches: int = 0
    undeletable: int = 0
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEEP_REASONS, 0))
    #: Ascending ids, so each batch is the oldest left. Deleted runs never come back; only runs
    #: kept would, so the cursor moves past the last of them (a run that still exists).
    cursor: str | None = None
    exhausted: bool = False


def purge_runs(
    instance: DagsterInstance,
    keep: timedelta = DEFAULT_KEEP,
    *,
    batch_size: int = RUN_RETENTION_BATCH_SIZE,
    budget_seconds: float = RUN_RETENTION_BUDGET_SECONDS,
    own_run_id: str | None = None,
    now: datetime | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_progress: Callable[[dict[str, object]], None] | None = None,
) -> RetentionReport:
    """Delete finished runs created more than ``keep`` ago, oldest first, within the budget.

    ``own_run_id`` (the retention run itself) is never deleted and is named in the log line.
    ``clock`` measures the budget (seconds); ``on_progress`` gets the counts so far once a minute.
    """
    if keep <= timedelta(0):
        raise ValueError(f"keep={keep} must be positive")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    started = clock()
    deadline = started + budget_seconds
    cutoff = cutoff_for(keep, now)
    selection = old_finished_runs(cutoff)
    tally = _Tally()
    next_progress = started + _PROGRESS_EVERY_SECONDS
    while not tally.exhausted:
        if clock() >= deadline:
            tally.exhausted = True
            break
        records = instance.get_run_records(
            filters=selection, limit=batch_size, ascending=True, cursor=tally.cursor
        )
        if not records:
            break
        tally.batches += 1
        for record in records:
            if clock() >= deadline:
                tally.exhausted = True
                break
            _purge_run(instance, record.dagster_run, cutoff, own_run_id, tally)
        if clock() >= next_progress:
            next_progress = clock() + _PROGRESS_EVERY_SECONDS
            _report_progress(own_run_id, tally, on_progress)
        if len(records) < batch_size:
            break
    report = _final_report(instance, selection, cutoff, tally, clock() - started)
    event(
        log,
        logging.INFO,
        "dagster runs purged",
        run_id=own_run_id,
        keep_days=keep / timedelta(days=1),
        **report.fields(),
    )
    return report


def _purge_run(
    instance: DagsterInstance,
    run: DagsterRun,
    cutoff: datetime,
    own_run_id: str | None,
    tally: _Tally,
) -> None:
    """Delete one old finished run with its files, or keep it (counted, the cursor past it)."""
    reason = keep_reason(instance, run, cutoff, own_run_id)  # just before the delete
    if reason is not None:
        tally.kept[reason] += 1
        tally.cursor = run.run_id
        return
    try:
        removed, removed_bytes = remove_run_files(instance, run.run_id)
    except OSError as error:
        tally.undeletable += 1
        tally.cursor = run.run_id
        event(
            log,
            logging.WARNING,
            "dagster run files not deletable; run kept",
            run_id=own_run_id,
            kept_run_id=run.run_id,
            error_kind=type(error).__name__,
            error=str(error),
        )
        return
    instance.delete_run(run.run_id)
    tally.deleted += 1
    tally.directories += removed
    tally.size += removed_bytes


def _report_progress(
    own_run_id: str | None,
    tally: _Tally,
    on_progress: Callable[[dict[str, object]], None] | None,
) -> None:
    """The counts so far, logged and handed to ``on_progress``."""
    so_far: dict[str, object] = {
        "run_id": own_run_id,
        "runs_deleted": tally.deleted,
        "bytes_removed": tally.size,
    }
    event(log, logging.INFO, "dagster run retention in progress", **so_far)
    if on_progress is not None:
        on_progress(so_far)


def _final_report(
    instance: DagsterInstance,
    selection: RunsFilter,
    cutoff: datetime,
    tally: _Tally,
    duration_seconds: float,
) -> RetentionReport:
    """The pass's report, with what is left for the next one counted now."""
    return RetentionReport(
        runs_deleted=tally.deleted,
        directories_removed=tally.directories,
        bytes_removed=tally.size,
        runs_kept_in_use=tally.kept["in_use"],
        left_for_next_time=instance.get_runs_count(selection),
        batches=tally.batches,
        duration_seconds=duration_seconds,
        budget_exhausted=tally.exhausted,
        cutoff=cutoff,
        runs_kept_backfill=tally.kept["backfill"],
        runs_kept_group_recent=tally.kept["group_recent"],
        runs_undeletable=tally.undeletable,
    )


def pool_connections(
    instance: DagsterInstance, statement_timeout_ms: int = DAGSTER_STATEMENT_TIMEOUT_MS
) -> None:
    """Pooled connections to Dagster's storage for the rest of this process, as in its webserver.

    dagster-postgres opens a new connection for every statement by default, and a run's deletion
    takes about eight: a pass deleted 17 runs/s that way and 77 runs/s on pooled connections
    (benchmarks/dagster_storage.py, docs/operations.md). Other storages ignore it.
    """
    instance.optimize_for_webserver(
        statement_timeout=statement_timeout_ms, pool_recycle=3600, max_overflow=1
    )


def runs_in_use(instance: DagsterInstance, own_run_id: str | None = None) -> frozenset[str]:
    """Ids no pass may delete now: ``own_run_id``, and the run groups of in-flight re-executions.

    A re-execution loads the step outputs it does not recompute from the runs before it in its
    group (same root run), so the whole group stays until it has finished.
    """
    ids = {own_run_id} if own_run_id else set()
    for record in instance.get_run_records(filters=RunsFilter(statuses=list(IN_FLIGHT_STATUSES))):
        run = record.dagster_run
        ids.add(run.run_id)
        if run.root_run_id:
            ids.add(run.root_run_id)
        if run.parent_run_id:
            ids.add(run.parent_run_id)
    return frozenset(ids)


def keep_reason(
    instance: DagsterInstance, run: DagsterRun, cutoff: datetime, own_run_id: str | None = None
) -> str | None:
    """Why ``run`` must stay now (one of KEEP_REASONS), or None; read afresh on every call."""
    if is_in_use(run, runs_in_use(instance, own_run_id)):
        return "in_use"
    backfill_id = run.tags.get(BACKFILL_TAG)
    if backfill_id and backfill_unfinished(instance, backfill_id):
        return "backfill"
    if group_has_recent_run(instance, run, cutoff):
        return "group_recent"
    return None


def backfill_unfinished(instance: DagsterInstance, backfill_id: str) -> bool:
    """True while the back-fill is requested, canceling or failing (its runs are its progress)."""
    backfill = instance.get_backfill(backfill_id)
    return backfill is not None and backfill.status.value not in FINISHED_BACKFILL_STATUSES


def group_has_recent_run(instance: DagsterInstance, run: DagsterRun, cutoff: datetime) -> bool:
    """True when a run of ``run``'s group (same root run) was created after ``cutoff``.

    The root is the group's oldest run, so only the runs tagged with its id need a look: one
    indexed tag look-up per run deleted.
    """
    root = run.root_run_id or run.run_id
    recent = RunsFilter(tags={ROOT_RUN_ID_TAG: root}, created_after=cutoff)
    return bool(instance.get_run_records(filters=recent, limit=1))


def is_in_use(run: DagsterRun, in_use: Iterable[str]) -> bool:
    """True when ``run`` is one of ``in_use`` or belongs to the run group of one of them."""
    group = {run.run_id, run.root_run_id, run.parent_run_id} - {None}
    return not group.isdisjoint(in_use)


def run_directory(instance: DagsterInstance, run_id: str) -> Path | None:
    """``<storage directory>/<run_id>``, or None when ``run_id`` is not a plain directory name."""
    # Run ids are UUIDs; a custom one with a separator or dots must never reach rmtree.
    if not run_id or run_id in (".", "..") or Path(run_id).name != run_id or os.sep in run_id:
        return None
    return Path(instance.storage_directory()) / run_id


def remove_run_files(instance: DagsterInstance, run_id: str) -> tuple[int, int]:
    """Delete the run's compute logs and step outputs; (directories removed, bytes removed)."""
    directory = run_directory(instance, run_id)
    if directory is None:
        return 0, 0
    existed = directory.is_dir()
    size = tree_bytes(directory) if existed else 0
    # The local compute log manager keeps a run's logs in this same directory (and removes it
    # whole); another manager (cloud storage) deletes its own copies by the same prefix.
    instance.compute_log_manager.delete_logs(prefix=[run_id])
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)
    return int(existed), size


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symbolic links not followed)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total
