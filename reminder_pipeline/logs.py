"""Structured JSON logs: an object per line, identifiers only (never titles or descriptions)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson


def _encode(data: dict[str, Any]) -> str:
    # orjson: UTF-8 as is, datetimes and UUIDs natively, anything else through str(); what it
    # refuses (an int beyond 64 bits, a non-string key) goes through json, never an exception.
    try:
        return orjson.dumps(data, default=str).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(data, default=str, ensure_ascii=False)


_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def event(logger: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """Log ``message`` with structured ``fields`` (ids, counts, statuses)."""
    logger.log(level, message, extra={"fields": fields})


def events(
    logger: logging.Logger, level: int, message: str, items: list[dict[str, Any]], **fields: Any
) -> None:
    """Log ``message`` once per item (``fields`` plus the item's own), as a single record.

    :class:`JsonFormatter` writes one line per item, exactly as many :func:`event` calls would;
    the logging machinery (record, handler locks, a flush) runs once per batch instead of once
    per reminder, which was a third of a catch-up's Python time.
    """
    if items and logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": fields, "items": items})


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The fields attached to a record by :func:`event` (the common ones for :func:`events`)."""
    return dict(getattr(record, "fields", {}) or {})


def items_of(record: logging.LogRecord) -> list[dict[str, Any]]:
    """The per-item fields of a record logged by :func:`events` (empty for :func:`event`)."""
    return list(getattr(record, "items", None) or ())


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, logger, msg and the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        message = record.getMessage()
        fields = fields_of(record)
        items = items_of(record)
        if not items:
            data = {**head, "msg": message, **fields}
            if record.exc_info and record.exc_info[0] is not None:
                data["exception"] = record.exc_info[0].__name__
            return _encode(data)
        # A batch record (events): a line per item, with the item's own "msg" if it has one;
        # the ts/level/logger part is encoded once.
        prefix = _encode(head)[:-1] + ","
        lines = []
        for item in items:
            body = {"msg": message, **fields}
            body.update(item)
            lines.append(prefix + _encode(body)[1:])
        return "\n".join(lines)


#: Marks the handlers :func:`configure` and :func:`to_file` add (found again, never doubled).
_OURS = "_reminder_pipeline_handler"


def _our_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if getattr(h, _OURS, False)]


def configure(level: int | None = None, stream: Any = None) -> None:
    """Send the package's logs to ``stream`` (stderr) as JSON lines; idempotent.

    ``level`` None keeps a level chosen before in this process (the command line's
    ``--log-level``: a command run inside it logs at the operator's level), else INFO.
    """
    logger = logging.getLogger("reminder_pipeline")
    if level is not None:
        logger.setLevel(level)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if _our_handlers(logger):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    setattr(handler, _OURS, True)
    logger.addHandler(handler)


class LineFormatter(logging.Formatter):
    """A record as one line for a person: ``<prefix>: <level>: <message> key=value ...``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        fields = fields_of(record)
        items = items_of(record)
        if items:
            fields["lines"] = len(items)
        if record.exc_info and record.exc_info[0] is not None:
            fields["exception"] = record.exc_info[0].__name__
        text = line(record.getMessage(), fields)
        return f"{self.prefix}: {record.levelname.lower()}: {' '.join(text.split())}"


class _LogFile(logging.FileHandler):
    """A log file opened (its folder made) at its first record: a run that logs nothing, like
    a refused ``up``, leaves nothing behind."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def to_file(path: Path, level: int, prefix: str) -> Path:
    """Write the package's JSON log to ``path`` (appended) at ``level``; the terminal (the
    handler :func:`configure` added) keeps one line per warning or error, for a person.

    For a command with lines of its own to print (``up``): its log no longer mixes with them.
    """
    logger = logging.getLogger("reminder_pipeline")
    configure()
    for handler in _our_handlers(logger):
        if isinstance(handler, logging.FileHandler):
            if handler.baseFilename == os.path.abspath(path):
                return path
            continue
        handler.setFormatter(LineFormatter(prefix))
        handler.setLevel(max(level, logging.WARNING))
    handler = _LogFile(path)
    handler.setFormatter(JsonFormatter())
    setattr(handler, _OURS, True)
    logger.addHandler(handler)
    logger.setLevel(level)
    return path


class Journal:
    """Where a cycle's records go: JSON lines through stdlib logging (always every line).

    A Dagster run passes a subclass that also writes them to the run's event log
    (:mod:`reminder_pipeline.defs.event_log`); the cycle itself only calls these two methods.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("reminder_pipeline.cycle")

    def event(self, level: int, message: str, **fields: Any) -> None:
        """One record: ``message`` with its fields (ids, counts, statuses)."""
        event(self.logger, level, message, **fields)

    def batch(self, level: int, message: str, items: list[dict[str, Any]], **fields: Any) -> None:
        """A batch's lines (one per item, each with its own ``msg``) as one record."""
        events(self.logger, level, message, items, **fields)


# --- a run's event log: the same records, folded ---------------------------------------------
#
# In a run log (a Dagster run's event log) a record's fields are written into its line, and a
# drain does not become an entry per batch (each entry is a write to Dagster's storage): a batch
# is one entry (a line per reminder, or counts with the first and last reminder id past
# ITEM_LINES), at most one batch entry per window; the batches in between fold into one progress
# entry, written when the window has passed, before any other record, or when the step ends.
# Warnings and errors are never folded. The JSON log keeps every line.


class RunLog(Protocol):
    """Where a run's entries go (Dagster's ``context.log`` is one)."""

    def log(self, level: int, msg: str) -> None:
        """Write one entry."""

    def info(self, msg: str) -> None:
        """Write one INFO entry."""


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
        return (
            f"{line(parts, fields)} (reminder_id {self.first_id} .. {self.last_id}; "
            "a line per reminder is in the process's JSON log)"
        )


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


class FoldingJournal(Journal):
    """A journal that also writes a run log (a Dagster step's ``context.log``), folded."""

    def __init__(
        self,
        log: RunLog,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        if (
            level < logging.WARNING
            and self._last_batch_at is not None
            and now - self._last_batch_at < self._window
        ):
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

    def __enter__(self) -> FoldingJournal:
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
            self._log.info(
                f"{count} more batch{'es' if count > 1 else ''}: {folded.line(self._folded_fields)}"
            )
