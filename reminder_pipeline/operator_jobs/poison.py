"""Poison rows for operators: list them, retry one now, or skip one for good.

The same calls behind ``reminder-pipeline poison`` and the ``reminder_poison_rows`` job. A row
is a poison row when it is still Pending after failed attempts; retry and skip act only on such
rows unless forced (a row that never failed is not an operator's business), each action in the
audit trail (:mod:`reminder_pipeline.audit`): who, the action and the row before it acts, what
changed after.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from ..audit import audited
from ..audit import os_user as os_user
from ..logs import RunLog
from ..store import repository

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
    return [
        {k: v if v is None or isinstance(v, int | str) else str(v) for k, v in r.items()}
        for r in rows
    ]


def change(
    engine: Engine,
    action: str,
    reminder_id: uuid.UUID | str,
    *,
    actor: str,
    force: bool = False,
    run_id: str | None = None,
    run_log: RunLog | None = None,
) -> Change:
    """Retry (clear the back-off) or skip (never published) one row in its own transaction.

    Audited before it acts and after; ``run_log`` (a Dagster run's) gets the same lines.
    """
    if action not in ACTIONS:
        raise ValueError(f"poison action {action!r} is not one of {', '.join(ACTIONS)}")
    rid = uuid.UUID(str(reminder_id))
    apply = repository.retry_poison_now if action == "retry" else repository.skip_poison
    with audited(
        f"poison row {action}",
        operator=actor,
        action=f"poison {action}",
        run_log=run_log,
        reminder_id=str(rid),
        forced=force,
        run_id=run_id,
    ) as outcome:
        with engine.begin() as conn:
            changed = apply(conn, rid, force=force)
            state = None if changed else repository.reminder_operator_state(conn, rid)
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
