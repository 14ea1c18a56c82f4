"""What a Dagster run's event log shows of the package's structured log records.

The package logs a fixed message plus ids and counts as fields (:mod:`reminder_pipeline.logs`);
``python_logs`` in dagster.yaml hands the ``reminder_pipeline`` logger's records to Dagster's
handler, which keeps only the message. For the duration of a step, :func:`fields_in_event_log`
puts an :class:`EventLogGate` where Dagster's handler sits on that logger. The gate

* writes a record's fields into its event-log line, so the entry says which reminder was sent;
* writes a batch record (a line per reminder) as one entry, and summarizes a batch of more than
  :data:`EVENT_LOG_ITEM_LINES` reminders (counts per message, first and last reminder id);
* keeps a multi-batch drain from writing an entry per batch: after a batch entry, further batch
  entries within :data:`EVENT_LOG_BATCH_WINDOW_SECONDS` are folded into one progress entry,
  written when the window has passed, before the next other record, or when the step ends.

Every entry costs the run a write to Dagster's storage (a new connection each time: its run
workers hold none open), about 20 ms here: at one entry per batch that was a seventh of a
100k-row catch-up run (benchmarks/README.md). Warnings and errors (a poison row, a failed
publish) and records without per-reminder lines pass straight through, in order. The process's
JSON log is not touched: it keeps a line per reminder whatever the event log shows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..logs import fields_of, items_of

#: A batch record with more per-reminder lines than this (a catch-up's batches; the seed's cycle
#: is 200) is summarized in the Dagster event log: counts per message, the first and last
#: reminder ids. Writing 1,000-line entries took a catch-up run from the drain's speed to ~0.85
#: of it, and 40 MB of memory (benchmarks/README.md).
EVENT_LOG_ITEM_LINES = 200

#: At most one batch entry per this many seconds in a step's event log; the batches in between
#: become one progress entry. A scheduled cycle (one batch) is never folded.
EVENT_LOG_BATCH_WINDOW_SECONDS = 10.0

_JSON_LOG_NOTE = "a line per reminder is in the process's JSON log"


def _line(message: str, fields: dict[str, Any]) -> str:
    return " ".join([message, *(f"{k}={v}" for k, v in fields.items() if v is not None)])


class _Tally:
    """Per-message counts of log lines and the range of reminder ids they name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first_id: Any = None
        self.last_id: Any = None

    def add(self, message: str, items: list[dict[str, Any]]) -> None:
        for item in items:
            text = item.get("msg", message)
            self.counts[text] = self.counts.get(text, 0) + 1
            if "reminder_id" in item:
                if self.first_id is None:
                    self.first_id = item["reminder_id"]
                self.last_id = item["reminder_id"]

    def line(self, fields: dict[str, Any]) -> str:
        parts = ", ".join(f"{text} x{n}" for text, n in self.counts.items())
        return (f"{_line(parts, fields)} "
                f"(reminder_id {self.first_id} .. {self.last_id}; {_JSON_LOG_NOTE})")


class _Folded:
    """Batch records held back from the event log: their per-message counts and reminder range."""

    def __init__(self) -> None:
        self.records = 0
        self.tally = _Tally()
        self.fields: dict[str, Any] = {}
        self.last: logging.LogRecord | None = None

    def add(self, record: logging.LogRecord) -> None:
        if not self.records:
            self.fields = fields_of(record)
        self.records += 1
        self.last = record
        self.tally.add(record.getMessage(), items_of(record))

    def record(self) -> logging.LogRecord:
        """One record standing for everything held back (the last one's logger, level, thread)."""
        assert self.last is not None
        batches = f"{self.records} more batch{'es' if self.records > 1 else ''}"
        last = self.last
        folded = logging.LogRecord(last.name, last.levelno, last.pathname, last.lineno,
                                   f"{batches}: {self.tally.line(self.fields)}", (), None,
                                   last.funcName)
        folded.fields = {}
        folded._fields_rendered = True
        return folded


def _summary(message: str, fields: dict, items: list[dict]) -> str:
    tally = _Tally()
    tally.add(message, items)
    return tally.line(fields)


def render(record: logging.LogRecord) -> None:
    """Put a structured record's fields (ids and counts only) into its message, in place."""
    fields = fields_of(record)
    items = items_of(record)
    if not (fields or items) or getattr(record, "_fields_rendered", False):
        return
    message = record.getMessage()
    summary = None
    per_reminder = [i for i in items if "reminder_id" in i]
    if len(per_reminder) > EVENT_LOG_ITEM_LINES:
        items = [i for i in items if "reminder_id" not in i]
        summary = _summary(message, fields, per_reminder)
    lines = []
    for item in items or ([] if summary else [{}]):
        merged = {**fields, **item}
        lines.append(_line(merged.pop("msg", message), merged))
    if summary:
        lines.append(summary)
    record.msg = "\n".join(lines)
    record.args = ()
    record._fields_rendered = True


def _is_batch(record: logging.LogRecord) -> bool:
    return record.levelno < logging.WARNING and any("reminder_id" in i for i in items_of(record))


class EventLogGate(logging.Handler):
    """Stands in for Dagster's handler on the package logger during a step (see the module doc)."""

    def __init__(self, target: logging.Handler,
                 window_seconds: float = EVENT_LOG_BATCH_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(level=target.level)
        self.target = target
        self.window_seconds = window_seconds
        self._clock = clock
        self._last_batch_at: float | None = None
        self._folded = _Folded()

    def emit(self, record: logging.LogRecord) -> None:
        if _is_batch(record):
            now = self._clock()
            if self._last_batch_at is not None and now - self._last_batch_at < self.window_seconds:
                self._folded.add(record)  # not rendered: only counted
                return
            self._last_batch_at = now
        self._flush()
        render(record)
        self.target.handle(record)

    def _flush(self) -> None:
        if self._folded.records:
            folded, self._folded = self._folded.record(), _Folded()
            self.target.handle(folded)

    def flush(self) -> None:
        """Write the progress entry for batches still held back (called when the step ends)."""
        self.acquire()
        try:
            self._flush()
        finally:
            self.release()


@contextmanager
def fields_in_event_log(window_seconds: float = EVENT_LOG_BATCH_WINDOW_SECONDS) -> Iterator[None]:
    """For the step's duration: the package logger's records reach Dagster's handler through a gate.

    The handler stays where Dagster put it (Dagster removes it when the step ends, which may come
    before this context exits in a generator op); only its ``handle`` is routed through the gate
    for the duration, and given back on exit.
    """
    from dagster._core.log_manager import DagsterLogHandler  # no public name for the handler type

    logger = logging.getLogger("reminder_pipeline")
    dagster_handler = next((h for h in logger.handlers if isinstance(h, DagsterLogHandler)), None)
    if dagster_handler is None or "handle" in vars(dagster_handler):
        # python_logs does not manage the package logger, or a gate already stands in: as is.
        yield
        return
    gate = EventLogGate(_Forward(dagster_handler), window_seconds)
    dagster_handler.handle = gate.handle
    try:
        yield
    finally:
        del dagster_handler.handle
        gate.flush()


class _Forward(logging.Handler):
    """The gate's target: the Dagster handler's own ``handle``, past the stand-in."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__(level=handler.level)
        self._handler = handler

    def handle(self, record: logging.LogRecord) -> bool:
        return type(self._handler).handle(self._handler, record)

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() is used
        self.handle(record)
