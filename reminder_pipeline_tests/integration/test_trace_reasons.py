"""The trace's reasons on the real database and broker: each state says when and by what.

``trace_ids`` answers for a list of ReminderIds in the caller's order (the finder's and the cards'
entry point), with the event's kind and the failed publish count named as such.
"""

from __future__ import annotations

import uuid

from reminder_pipeline import cycle
from reminder_pipeline.operator_jobs import trace
from reminder_pipeline_tests.support import make_due_event, reminders

UI = "http://127.0.0.1:3000"


def test_trace_ids_answers_in_the_given_order_and_leaves_unknown_ids_out(engine, publisher):
    first = make_due_event(engine, kind="Showing")
    second = make_due_event(engine, kind="Call", minutes_overdue=-30)
    cycle.run_cycle(engine, publisher)
    [sent], [pending] = reminders(engine, first), reminders(engine, second)

    items = trace.trace_ids(engine, [pending["id"], uuid.uuid4(), sent["id"]], ui_url=UI)

    assert [i["reminder_id"] for i in items] == [str(pending["id"]), str(sent["id"])]
    assert [i["kind"] for i in items] == ["Call", "Showing"]
    assert list(items[1]) == list(trace.FIELDS)
    assert items[1]["failed_publish_attempts"] == 0 and "publish_attempts" not in items[1]
    assert items[0]["status"] == "Pending" and items[0]["reason"].startswith("not due yet")
    assert trace.trace_ids(engine, [], ui_url=UI) == []
