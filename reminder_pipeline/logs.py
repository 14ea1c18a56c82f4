"""Structured JSON logs: one object per line, identifiers only (never titles, descriptions, locations)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def event(logger: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """Log ``message`` with structured ``fields`` (ids, counts, statuses)."""
    logger.log(level, message, extra={"fields": fields})


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields attached to a record by :func:`event`."""
    return dict(getattr(record, "fields", {}) or {})


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, logger, msg and the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(fields_of(record))
        if record.exc_info and record.exc_info[0] is not None:
            data["exception"] = record.exc_info[0].__name__
        return json.dumps(data, default=str, ensure_ascii=False)


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
