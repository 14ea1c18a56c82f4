"""Structured JSON logs: one object per line, identifiers only (never titles, descriptions, locations)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

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
    """The structured fields attached to a record by :func:`event` (common ones for :func:`events`)."""
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


def configure(level: int = logging.INFO, stream: Any = None) -> None:
    """Send the package's logs to ``stream`` (stderr) as JSON lines; idempotent."""
    logger = logging.getLogger("reminder_pipeline")
    logger.setLevel(level)
    for handler in logger.handlers:
        if isinstance(handler.formatter, JsonFormatter):
            return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)


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
