"""What a Dagster run's event log shows of the package's structured records (defs.event_log)."""

from __future__ import annotations

import logging

import pytest

from reminder_pipeline import logs
from reminder_pipeline.defs.event_log import EVENT_LOG_ITEM_LINES, EventLogGate


class _Capture(logging.Handler):
    """Stands for Dagster's handler: what reaches it is what the event log gets."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.levels.append(record.levelno)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gated():
    logger = logging.getLogger("reminder_pipeline.test_event_log_lines")
    capture = _Capture()
    clock = _Clock()
    gate = EventLogGate(capture, window_seconds=10.0, clock=clock)
    logger.addHandler(gate)  # where Dagster's handler sits during a step
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, capture, gate, clock
    logger.handlers.clear()
    logger.propagate = True


def _batch(n: int, start: int = 0) -> list[dict]:
    selected = {"msg": "batch selected", "count": n, "skipped_locked": 0}
    return [selected] + [{"msg": "reminder sent", "reminder_id": f"r{i}", "event_id": f"e{i}"}
                         for i in range(start, start + n)]


def test_a_cycle_batch_is_one_entry_with_a_line_per_reminder(gated):
    logger, capture, _, _ = gated
    logs.events(logger, logging.INFO, "batch written", _batch(EVENT_LOG_ITEM_LINES), run_id="run-1")
    [entry] = capture.messages
    lines = entry.splitlines()
    assert lines[0] == f"batch selected run_id=run-1 count={EVENT_LOG_ITEM_LINES} skipped_locked=0"
    assert len(lines) == 1 + EVENT_LOG_ITEM_LINES
    assert lines[1] == "reminder sent run_id=run-1 reminder_id=r0 event_id=e0"


def test_a_catch_up_batch_is_summarized_and_keeps_its_selection_line(gated):
    logger, capture, _, _ = gated
    logs.events(logger, logging.INFO, "batch written", _batch(1000), run_id="run-2")
    [entry] = capture.messages
    lines = entry.splitlines()
    assert lines[0] == "batch selected run_id=run-2 count=1000 skipped_locked=0"
    assert len(lines) == 2
    assert lines[1].startswith("reminder sent x1000 run_id=run-2 (reminder_id r0 .. r999;")


def test_a_plain_event_keeps_its_fields(gated):
    logger, capture, _, _ = gated
    logs.event(logger, logging.INFO, "cycle completed", run_id="run-3", sent=2, oldest=None)
    assert capture.messages == ["cycle completed run_id=run-3 sent=2"]


def test_a_drain_writes_one_batch_entry_per_window_and_folds_the_rest_in_order(gated):
    logger, capture, gate, clock = gated
    for k in range(5):  # five batches within one window: the first as is, four folded
        clock.now = k * 1.0
        logs.events(logger, logging.INFO, "batch written", _batch(300, start=300 * k), run_id="r")
    assert len(capture.messages) == 1
    logs.event(logger, logging.WARNING, "poison row excluded", reminder_id="r-bad")
    # The folded batches are written before the later record, so the entries stay in order.
    assert len(capture.messages) == 3
    folded, poison = capture.messages[1:]
    assert folded.startswith("4 more batches: batch selected x4, reminder sent x1200 run_id=r")
    assert "(reminder_id r300 .. r1499;" in folded
    assert poison == "poison row excluded reminder_id=r-bad"

    clock.now = 5.0  # still within the window of the first batch entry: held back again
    logs.events(logger, logging.INFO, "batch written", _batch(300, start=1500), run_id="r")
    clock.now = 10.5  # past the window: this batch is an entry of its own again
    logs.events(logger, logging.INFO, "batch written", _batch(300, start=1800), run_id="r")
    assert capture.messages[3].startswith("1 more batch: batch selected x1, reminder sent x300")
    assert capture.messages[4].startswith("batch selected run_id=r count=300")
    assert len(capture.messages) == 5

    clock.now = 11.0
    logs.events(logger, logging.INFO, "batch written", _batch(300, start=2100), run_id="r")
    gate.flush()  # the step ends: what is held back is written
    assert capture.messages[5].startswith("1 more batch:")
    assert "(reminder_id r2100 .. r2399;" in capture.messages[5]
    gate.flush()
    assert len(capture.messages) == 6


def test_warnings_and_records_without_reminder_lines_are_never_folded(gated):
    logger, capture, _, clock = gated
    logs.events(logger, logging.INFO, "batch written", _batch(2), run_id="r")
    logs.events(logger, logging.WARNING, "reminders failed", _batch(2, start=2), run_id="r")
    logs.event(logger, logging.INFO, "cycle completed", run_id="r", sent=4)
    assert len(capture.messages) == 3
    assert capture.levels == [logging.INFO, logging.WARNING, logging.INFO]
    assert capture.messages[2] == "cycle completed run_id=r sent=4"


def test_a_real_step_restores_dagsters_handler_and_writes_what_was_held_back():
    """Through Dagster: a job whose op logs many batches (python_logs managing the package
    logger) gets one entry for the first, one folded entry for the rest; the handler is back."""
    from dagster import instance_for_test, job, op

    from reminder_pipeline.defs.event_log import fields_in_event_log

    package = logging.getLogger("reminder_pipeline")

    @op
    def drains(context) -> None:
        with fields_in_event_log():
            for k in range(20):
                logs.events(logging.getLogger("reminder_pipeline.cycle"), logging.INFO,
                            "batch written", _batch(250, start=250 * k), run_id=context.run_id)
        context.log.info(f"handlers after the step body: {[type(h).__name__ for h in package.handlers]}")

    @job
    def j() -> None:
        drains()

    overrides = {"python_logs": {"managed_python_loggers": ["reminder_pipeline"],
                                 "python_log_level": "INFO"}}
    with instance_for_test(overrides=overrides) as instance:
        result = j.execute_in_process(instance=instance)
        messages = [e.user_message for e in instance.all_logs(result.run_id)
                    if not e.is_dagster_event]
    batch_entries = [m for m in messages if m.startswith("batch selected")]
    folded = [m for m in messages if "more batches:" in m]
    assert len(batch_entries) == 1
    assert len(folded) == 1 and folded[0].startswith("19 more batches:")
    assert "reminder sent x4750" in folded[0]
    assert any("DagsterLogHandler" in m for m in messages if m.startswith("handlers after"))
