"""What a Dagster run's event log shows of a cycle: its records, written through ``context.log``.

Every record also goes to the JSON log (stdlib logging, a line per reminder). In the event log a
record's fields are written into its line, and a drain does not become an entry per batch (each
entry is a write to Dagster's storage): a batch is one entry (a line per reminder, or counts with
the first and last reminder id past :data:`ITEM_LINES`), at most one batch entry per window; the
batches in between fold into one progress entry, written when the window has passed, before any
other record, or when the step ends. Warnings and errors are never folded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dagster import DagsterLogManager

from ..logs import Journal

#: A batch with more per-reminder lines than this (a catch-up's) is summarized in its entry.
ITEM_LINES = 200
#: At most one batch entry per this many seconds; the batches in between are folded.
WINDOW_SECONDS = 10.0


def line(message: str, fields: dict[str, Any]) -> str:
    """``message`` followed by its non-empty fields as ``key=value``."""
    return " ".join([message, *(f"{k}={v}" for k, v in fields.items() if v is not None)])


class _Tally:
    """Per-message counts of lines and the range of reminder ids they name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first_id: Any = None
        self.last_id: Any = None
        self.batches = 0

    def add(self, items: list[dict[str, Any]]) -> None:
        self.batches += 1
        for item in items:
            self.counts[item["msg"]] = self.counts.get(item["msg"], 0) + 1
            if "reminder_id" in item:
                self.first_id = self.first_id or item["reminder_id"]
                self.last_id = item["reminder_id"]

    def line(self, fields: dict[str, Any]) -> str:
        parts = ", ".join(f"{text} x{n}" for text, n in self.counts.items())
        return (f"{line(parts, fields)} (reminder_id {self.first_id} .. {self.last_id}; "
                "a line per reminder is in the process's JSON log)")


def render_batch(message: str, items: list[dict[str, Any]], fields: dict[str, Any]) -> str:
    """A batch as one entry: a line per item, or its summary when it names many reminders."""
    items = [{"msg": message, **item} for item in items]
    per_reminder = [i for i in items if "reminder_id" in i]
    if len(per_reminder) <= ITEM_LINES:
        return "\n".join(line(i.pop("msg"), {**fields, **i}) for i in items)
    tally = _Tally()
    tally.add(per_reminder)
    others = [line(i.pop("msg"), {**fields, **i}) for i in items if "reminder_id" not in i]
    return "\n".join([*others, tally.line(fields)])


class DagsterJournal(Journal):
    """A cycle's journal in a Dagster step: the JSON log, and the run's event log (folded)."""

    def __init__(self, log: DagsterLogManager, window_seconds: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._log = log
        self._window = window_seconds
        self._clock = clock
        self._last_batch_at: float | None = None
        self._folded = _Tally()
        self._folded_fields: dict[str, Any] = {}

    def event(self, level: int, message: str, **fields: Any) -> None:
        super().event(level, message, **fields)
        self._write(level, line(message, fields))

    def batch(self, level: int, message: str, items: list[dict[str, Any]], **fields: Any) -> None:
        super().batch(level, message, items, **fields)
        if not items:
            return
        now = self._clock()
        if (level < logging.WARNING and self._last_batch_at is not None
                and now - self._last_batch_at < self._window):
            if not self._folded.batches:
                self._folded_fields = fields
            self._folded.add([{"msg": message, **i} for i in items])
            return
        self._write(level, render_batch(message, items, fields))
        if level < logging.WARNING:
            self._last_batch_at = now

    def close(self) -> None:
        """Write the progress entry of the batches still held back (the step ends)."""
        self._flush()

    def __enter__(self) -> DagsterJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, level: int, text: str) -> None:
        self._flush()
        self._log.log(level, text)

    def _flush(self) -> None:
        if self._folded.batches:
            folded, self._folded = self._folded, _Tally()
            count = folded.batches
            self._log.info(f"{count} more batch{'es' if count > 1 else ''}: "
                           f"{folded.line(self._folded_fields)}")
