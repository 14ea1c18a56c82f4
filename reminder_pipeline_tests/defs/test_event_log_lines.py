"""What a Dagster run's event log shows of a cycle's records (defs.event_log.FoldingJournal)."""

from __future__ import annotations

import logging

import pytest

from reminder_pipeline.logs import ITEM_LINES, FoldingJournal


class _RunLog:
    """Stands for ``context.log``: what reaches it is what the event log gets."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.levels: list[int] = []

    def log(self, level: int, message: str) -> None:
        self.messages.append(message)
        self.levels.append(level)

    def info(self, message: str) -> None:
        self.log(logging.INFO, message)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def journaled():
    run_log, clock = _RunLog(), _Clock()
    return FoldingJournal(run_log, window_seconds=10.0, clock=clock), run_log, clock


def _batch(n: int, start: int = 0) -> list[dict]:
    selected = {"msg": "batch selected", "count": n, "skipped_locked": 0}
    return [selected] + [
        {"msg": "reminder sent", "reminder_id": f"r{i}", "event_id": f"e{i}"}
        for i in range(start, start + n)
    ]


def test_a_cycle_batch_is_one_entry_with_a_line_per_reminder(journaled):
    journal, run_log, _ = journaled
    journal.batch(logging.INFO, "batch written", _batch(ITEM_LINES), run_id="run-1")
    [entry] = run_log.messages
    lines = entry.splitlines()
    assert lines[0] == f"batch selected run_id=run-1 count={ITEM_LINES} skipped_locked=0"
    assert len(lines) == 1 + ITEM_LINES
    assert lines[1] == "reminder sent run_id=run-1 reminder_id=r0 event_id=e0"


def test_a_catch_up_batch_is_summarized_and_keeps_its_selection_line(journaled):
    journal, run_log, _ = journaled
    journal.batch(logging.INFO, "batch written", _batch(1000), run_id="run-2")
    [entry] = run_log.messages
    lines = entry.splitlines()
    assert lines[0] == "batch selected run_id=run-2 count=1000 skipped_locked=0"
    assert len(lines) == 2
    assert lines[1].startswith("reminder sent x1000 run_id=run-2 (reminder_id r0 .. r999;")


def test_a_plain_event_keeps_its_fields(journaled):
    journal, run_log, _ = journaled
    journal.event(logging.INFO, "cycle completed", run_id="run-3", sent=2, oldest=None)
    assert run_log.messages == ["cycle completed run_id=run-3 sent=2"]


def test_a_drain_writes_one_batch_entry_per_window_and_folds_the_rest_in_order(journaled):
    journal, run_log, clock = journaled
    for k in range(5):  # five batches within one window: the first as is, four folded
        clock.now = k * 1.0
        journal.batch(logging.INFO, "batch written", _batch(300, start=300 * k), run_id="r")
    assert len(run_log.messages) == 1
    journal.event(logging.WARNING, "poison row excluded", reminder_id="r-bad")
    # The folded batches are written before the later record, so the entries stay in order.
    assert len(run_log.messages) == 3
    folded, poison = run_log.messages[1:]
    assert folded.startswith("4 more batches: batch selected x4, reminder sent x1200 run_id=r")
    assert "(reminder_id r300 .. r1499;" in folded
    assert poison == "poison row excluded reminder_id=r-bad"

    clock.now = 5.0  # still within the window of the first batch entry: held back again
    journal.batch(logging.INFO, "batch written", _batch(300, start=1500), run_id="r")
    clock.now = 10.5  # past the window: this batch is an entry of its own again
    journal.batch(logging.INFO, "batch written", _batch(300, start=1800), run_id="r")
    assert run_log.messages[3].startswith("1 more batch: batch selected x1, reminder sent x300")
    assert run_log.messages[4].startswith("batch selected run_id=r count=300")
    assert len(run_log.messages) == 5

    clock.now = 11.0
    journal.batch(logging.INFO, "batch written", _batch(300, start=2100), run_id="r")
    journal.close()  # the step ends: what is held back is written
    assert run_log.messages[5].startswith("1 more batch:")
    assert "(reminder_id r2100 .. r2399;" in run_log.messages[5]
    journal.close()
    assert len(run_log.messages) == 6


def test_warnings_and_records_without_reminder_lines_are_never_folded(journaled):
    journal, run_log, _ = journaled
    journal.batch(logging.INFO, "batch written", _batch(2), run_id="r")
    journal.batch(logging.WARNING, "reminders failed", _batch(2, start=2), run_id="r")
    journal.event(logging.INFO, "cycle completed", run_id="r", sent=4)
    assert len(run_log.messages) == 3
    assert run_log.levels == [logging.INFO, logging.WARNING, logging.INFO]
    assert run_log.messages[2] == "cycle completed run_id=r sent=4"


def test_every_record_also_reaches_the_json_log_a_line_per_reminder(journaled, caplog):
    journal, _, clock = journaled
    with caplog.at_level(logging.INFO, logger="reminder_pipeline"):
        for k in range(3):  # folded in the event log, never in the JSON log
            clock.now = k
            journal.batch(logging.INFO, "batch written", _batch(2, start=2 * k), run_id="r")
    [record] = [r for r in caplog.records if r.getMessage() == "batch written"][:1]
    assert len([r for r in caplog.records if r.getMessage() == "batch written"]) == 3
    assert [i["reminder_id"] for i in record.items if "reminder_id" in i] == ["r0", "r1"]


def test_a_real_step_gets_one_batch_entry_and_one_folded_entry():
    """Through Dagster's public API: an op writing many batches through its journal."""
    from dagster import instance_for_test, job, op

    @op
    def drains(context) -> None:
        with FoldingJournal(context.log) as journal:
            for k in range(20):
                journal.batch(
                    logging.INFO, "batch written", _batch(250, start=250 * k), run_id=context.run_id
                )

    @job
    def j() -> None:
        drains()

    with instance_for_test() as instance:
        result = j.execute_in_process(instance=instance)
        messages = [
            e.user_message for e in instance.all_logs(result.run_id) if not e.is_dagster_event
        ]
    batch_entries = [m for m in messages if m.startswith("batch selected")]
    folded = [m for m in messages if "more batches:" in m]
    assert len(batch_entries) == 1
    assert len(folded) == 1 and folded[0].startswith("19 more batches:")
    assert "reminder sent x4750" in folded[0]
