"""The relay's low-water mark moves only over ids no transaction in flight can still commit.

Plain Python: :class:`~reminder_pipeline.messaging.low_water.LowWater` on made-up snapshots (the
integration tests read real ones).
"""

from __future__ import annotations

from reminder_pipeline.messaging.low_water import LowWater
from reminder_pipeline.store.outbox_repository import StatementSnapshot


def test_a_clean_read_is_a_proposal_until_its_transactions_in_flight_have_ended():
    mark = LowWater(10)
    mark.saw(StatementSnapshot(xmin=100, xmax=105), clean_to=50)  # 100..104 may hold ids below 50
    assert mark.low == 10
    mark.saw(StatementSnapshot(xmin=104, xmax=110), clean_to=60)  # 104 still in flight
    assert mark.low == 10
    mark.saw(StatementSnapshot(xmin=105, xmax=112), clean_to=70)  # all of them ended
    assert mark.low == 50


def test_a_row_committed_late_below_a_proposal_holds_the_mark_at_it():
    mark = LowWater(10)
    mark.saw(StatementSnapshot(xmin=100, xmax=105), clean_to=50)
    mark.saw(
        StatementSnapshot(xmin=200, xmax=201), clean_to=30
    )  # id 30 committed since, unpublished
    assert mark.low == 30


def test_published_rows_are_proposed_on_the_snapshot_that_read_them():
    mark = LowWater(0)
    mark.saw(StatementSnapshot(xmin=7, xmax=9), clean_to=1)
    mark.propose(1001, 9)  # rows 1..1000 read on that snapshot and published
    mark.saw(StatementSnapshot(xmin=9, xmax=12), clean_to=1001)
    assert mark.low == 1001


def test_the_mark_never_moves_back():
    mark = LowWater(500)
    mark.saw(StatementSnapshot(xmin=1, xmax=2), clean_to=400)
    mark.saw(StatementSnapshot(xmin=3, xmax=4), clean_to=450)
    assert mark.low == 500
