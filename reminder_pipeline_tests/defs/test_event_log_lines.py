"""What a Dagster run's event log shows of the package's structured records (ops._FieldsInMessage)."""

from __future__ import annotations

import logging

import pytest

from reminder_pipeline import logs
from reminder_pipeline.defs.ops import EVENT_LOG_ITEM_LINES, _FieldsInMessage


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def rendered():
    logger = logging.getLogger("reminder_pipeline.test_event_log_lines")
    capture = _Capture()
    logger.addHandler(_FieldsInMessage())  # placed before Dagster's handler in a run
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    yield logger, capture.messages
    logger.handlers.clear()


def _batch(n: int) -> list[dict]:
    selected = {"msg": "batch selected", "count": n, "skipped_locked": 0}
    return [selected] + [{"msg": "reminder sent", "reminder_id": f"r{i}", "event_id": f"e{i}"}
                         for i in range(n)]


def test_a_cycle_batch_is_one_entry_with_a_line_per_reminder(rendered):
    logger, messages = rendered
    logs.events(logger, logging.INFO, "batch written", _batch(EVENT_LOG_ITEM_LINES), run_id="run-1")
    [entry] = messages
    lines = entry.splitlines()
    assert lines[0] == f"batch selected run_id=run-1 count={EVENT_LOG_ITEM_LINES} skipped_locked=0"
    assert len(lines) == 1 + EVENT_LOG_ITEM_LINES
    assert lines[1] == "reminder sent run_id=run-1 reminder_id=r0 event_id=e0"


def test_a_catch_up_batch_is_summarized_and_keeps_its_selection_line(rendered):
    logger, messages = rendered
    logs.events(logger, logging.INFO, "batch written", _batch(1000), run_id="run-2")
    [entry] = messages
    lines = entry.splitlines()
    assert lines[0] == "batch selected run_id=run-2 count=1000 skipped_locked=0"
    assert len(lines) == 2
    assert lines[1].startswith("reminder sent x1000 run_id=run-2 (reminder_id r0 .. r999;")


def test_a_plain_event_keeps_its_fields(rendered):
    logger, messages = rendered
    logs.event(logger, logging.INFO, "cycle completed", run_id="run-3", sent=2, oldest=None)
    assert messages == ["cycle completed run_id=run-3 sent=2"]
