"""What a dispatch step hands the next: builtins and AsOf's datetime, never AsOf as text again.

AsOf is parsed once where it enters (the run config, the CLI); the step outputs carry the
timezone-aware datetime and the IO manager (pickle) stores it. A step output stored by an older
version held AsOf as ISO-8601 text: a step re-executed from the UI still reads it.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone

from reminder_pipeline.cycle.records import Cycle


def test_a_cycle_hands_on_its_as_of_as_a_datetime() -> None:
    as_of = datetime(2026, 11, 30, 13, 0, tzinfo=timezone(timedelta(hours=3)))
    cycle = Cycle("run-1", as_of, 200)
    handed = cycle.plain()["as_of"]
    assert isinstance(handed, datetime) and handed == as_of
    again = Cycle.from_plain(pickle.loads(pickle.dumps(cycle.plain())))
    assert again == cycle and again.as_of.utcoffset() == timedelta(hours=3)


def test_an_older_step_output_s_as_of_text_is_still_read() -> None:
    from reminder_pipeline.defs.step_records import DueSelection

    cycle = Cycle("run-2", datetime(2026, 11, 30, 10, 0, tzinfo=UTC), 200)
    older = {**cycle.plain(), "as_of": "2026-11-30T10:00:00+00:00"}
    older.pop("scan_from")  # before issue 41: no scan start (the oldest end)
    older.pop("full_sweep")
    selection = DueSelection.read({"cycle": older, "ids": [], "skipped_locked": 0})
    assert selection.cycle == cycle  # read at the Dagster edge (defs/step_records.py)


def _records():
    from reminder_pipeline.cycle import Decisions, Written
    from reminder_pipeline.defs.step_records import DecidedSelection, DueSelection, WrittenCycle
    from reminder_pipeline.domain.model import CycleCounts

    cycle = Cycle("run-3", datetime(2026, 11, 30, 10, 0, tzinfo=UTC), 200)
    selection = DueSelection(cycle, ["a", "b"], 1)
    decided = DecidedSelection(selection, Decisions(["a"], ["b"]))
    written = WrittenCycle(cycle, Written("run-3", CycleCounts(sent=1, skipped=1)))
    return selection, decided, written


def test_the_steps_hand_on_typed_records_stored_as_their_plain_values() -> None:
    for record in _records():
        stored = pickle.dumps(record)
        # The IO manager's pickle holds the loader and builtins, not the record's field layout.
        assert pickle.loads(stored) == record
        assert pickle.loads(pickle.dumps(record.plain())) == record.plain()
        assert type(record).from_plain(record.plain()) == record


def test_a_step_output_stored_as_a_dict_by_an_older_version_is_still_read() -> None:
    for record in _records():
        older = pickle.loads(pickle.dumps(record.plain()))  # what steps stored before the records
        assert type(record).read(older) == record
        assert type(record).read(record) is record
