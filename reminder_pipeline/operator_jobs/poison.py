"""Poison rows for operators: list them, retry now or skip for good one row or those a filter takes.

The same calls behind ``reminder-pipeline poison`` and the ``reminder_poison_rows`` job. A row
is a poison row when it is still Pending after failed attempts; retry and skip act only on such
rows unless forced (a row that never failed is not an operator's business), each action in the
audit trail (:mod:`reminder_pipeline.audit`): who, the action and the row before it acts, what
changed after. A filter (:class:`PoisonFilter`: every poison row, an event's, a kind's, those
failed since a time) acts on many rows at once (:func:`change_many`), with a dry run first.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ..audit import audited
from ..audit import os_user as os_user
from ..config import DEFAULT_POISON_LOCK_TIMEOUT_SECONDS
from ..logs import RunLog
from ..store import operator_repository as repository
from ..store import row_locks
from ..store.operator_repository import PoisonFilter as PoisonFilter

ACTIONS = ("retry", "skip")


@dataclass(frozen=True)
class Change:
    """What a retry or skip did: ``changed``, or why nothing changed (``reason``)."""

    action: str
    reminder_id: str
    changed: bool
    forced: bool
    reason: str | None = None

    def plain(self) -> dict[str, Any]:
        """As builtins (output of the Dagster job)."""
        return {"action": self.action, "reminder_id": self.reminder_id, "changed": self.changed}


def list_rows(engine: Engine, limit: int) -> list[dict[str, Any]]:
    """Pending rows with failed attempts, oldest due first, values as JSON-friendly text."""
    with engine.connect() as conn:
        rows = repository.list_poison(conn, limit)
    return [_plain(r) for r in rows]


def held_reason(timeout_seconds: float) -> str:
    """Why one row's retry or skip changed nothing: another session held it too long."""
    return (
        f"its row is held by another session and could not be taken within "
        f"{timeout_seconds:g}s; run it again once that session ends"
    )


def change(
    engine: Engine,
    action: str,
    reminder_id: uuid.UUID | str,
    *,
    actor: str,
    force: bool = False,
    run_id: str | None = None,
    run_log: RunLog | None = None,
    lock_timeout_seconds: float = DEFAULT_POISON_LOCK_TIMEOUT_SECONDS,
) -> Change:
    """Retry (clear the back-off) or skip (never published) one row in its own transaction.

    Audited before it acts and after; ``run_log`` (a Dagster run's) gets the same lines. A row
    another session holds longer than ``lock_timeout_seconds`` changes nothing: the reason says
    it is held (never a wait for the statement timeout).
    """
    if action not in ACTIONS:
        raise ValueError(f"poison action {action!r} is not one of {', '.join(ACTIONS)}")
    rid = uuid.UUID(str(reminder_id))
    with audited(
        f"poison row {action}",
        operator=actor,
        action=f"poison {action}",
        run_log=run_log,
        reminder_id=str(rid),
        forced=force,
        run_id=run_id,
    ) as outcome:
        try:
            with engine.begin() as conn:
                row_locks.bound_lock_waits(conn, int(lock_timeout_seconds * 1000))
                changed = (
                    repository.retry_poison_now(conn, rid, force=force)
                    if action == "retry"
                    else repository.skip_poison(conn, rid, force=force, run_id=run_id)
                )
                state = None if changed else repository.reminder_operator_state(conn, rid)
        except sa.exc.OperationalError as error:
            if not row_locks.is_lock_timeout(error):
                raise
            outcome.fields.update(changed=False, locked=True)
            return Change(action, str(rid), False, force, held_reason(lock_timeout_seconds))
        outcome.fields["changed"] = changed
    if changed:
        return Change(action, str(rid), True, force)
    if state is None:
        reason = "there is no such reminder"
    elif state[0] != "Pending":
        reason = f"it is {state[0]}, not Pending"
    else:
        reason = "it has not failed (attempts=0); force acts on any Pending row"
    return Change(action, str(rid), False, force, reason)


#: Reminder ids named in a bulk action's audit line at most (the count is always there).
AUDITED_IDS = 100
#: Locked rows named in a refusal at most (the count is always there).
NAMED_LOCKED_IDS = 20


class RowsLocked(RuntimeError):
    """A bulk action could not take some of its rows within its lock timeout: nothing changed."""

    def __init__(self, action: str, locked: list[str], timeout_seconds: float) -> None:
        named = ", ".join(locked[:NAMED_LOCKED_IDS])
        more = (
            f" and {len(locked) - NAMED_LOCKED_IDS} more" if len(locked) > NAMED_LOCKED_IDS else ""
        )
        rows = (
            f"{len(locked)} rows held by another session ({named}{more})"
            if locked
            else ("rows held by another session (released since)")
        )
        super().__init__(
            f"poison {action}: nothing changed: {rows} could not be taken within "
            f"{timeout_seconds:g}s; run it again once that session ends"
        )
        self.locked = locked


@dataclass(frozen=True)
class BulkChange:
    """What a bulk retry or skip did (or, in a dry run, would do): the rows, by id."""

    action: str
    dry_run: bool
    selector: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def count(self) -> int:
        """How many rows changed (or would change)."""
        return len(self.rows)

    def plain(self) -> dict[str, Any]:
        """As builtins (``--json``, the Dagster job's output)."""
        return {
            "action": self.action,
            "dry_run": self.dry_run,
            "selector": self.selector,
            "count": self.count,
            "rows": self.rows,
        }


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's values as JSON-friendly text: times as ISO-8601 (``T``), ids as text."""
    return {
        k: v
        if v is None or isinstance(v, int | str)
        else v.isoformat()
        if isinstance(v, datetime)
        else str(v)
        for k, v in row.items()
    }


def change_many(
    engine: Engine,
    action: str,
    selected: PoisonFilter,
    *,
    actor: str,
    dry_run: bool = False,
    run_id: str | None = None,
    run_log: RunLog | None = None,
    lock_timeout_seconds: float = DEFAULT_POISON_LOCK_TIMEOUT_SECONDS,
) -> BulkChange:
    """Retry or skip every poison row ``selected`` takes, in one transaction; or, ``dry_run``,
    list them and change nothing.

    Only poison rows (Pending with failed attempts): a filter never reaches a healthy row. The
    real run is audited: one line before it acts (who, the filter, how many rows match) and one
    after (how many changed, their ids up to :data:`AUDITED_IDS`). A row another session holds
    longer than ``lock_timeout_seconds`` makes it change nothing and raise :class:`RowsLocked`
    naming the rows it could not take.
    """
    if action not in ACTIONS:
        raise ValueError(f"poison action {action!r} is not one of {', '.join(ACTIONS)}")
    selector = selected.described()
    with engine.connect() as conn:
        matching = [_plain(r) for r in repository.poison_by_filter(conn, selected)]
    if dry_run:
        return BulkChange(action, True, selector, matching)
    with audited(
        f"poison rows {action}",
        operator=actor,
        action=f"poison {action}",
        run_log=run_log,
        **selector,
        matching=len(matching),
        run_id=run_id,
    ) as outcome:
        try:
            with engine.begin() as conn:
                row_locks.bound_lock_waits(conn, int(lock_timeout_seconds * 1000))
                changed = repository.change_poison_by_filter(conn, action, selected, run_id=run_id)
        except sa.exc.OperationalError as error:
            if not row_locks.is_lock_timeout(error):
                raise
            with engine.connect() as conn:  # rolled back on close: takes nothing for good
                locked = row_locks.locked_reminders(conn, [r["id"] for r in matching])
            outcome.fields.update(changed=0, locked=len(locked), reminder_ids=locked[:AUDITED_IDS])
            raise RowsLocked(action, locked, lock_timeout_seconds) from None
        outcome.fields.update(
            changed=len(changed),
            reminder_ids=changed[:AUDITED_IDS],
            reminder_ids_left_out=max(len(changed) - AUDITED_IDS, 0),
        )
    listed = {r["id"]: r for r in matching}  # a row that failed since the read: its id alone
    return BulkChange(action, False, selector, [listed.get(i) or {"id": i} for i in changed])
