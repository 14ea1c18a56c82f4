"""Progress lines on stderr: at most one per interval, with the drain's rows, rate and backlog."""

from __future__ import annotations

import io

from reminder_pipeline.cli import ProgressLine


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_is_written_only_once_per_interval():
    clock, stream = Clock(), io.StringIO()
    progress = ProgressLine(stream, every_seconds=5, clock=clock)
    assert not progress.tick("loading")  # short work prints nothing
    clock.now += 4.9
    assert not progress.tick("loading")
    clock.now += 0.1
    assert progress.tick("loading")
    assert not progress.tick("loading")  # the interval counts from the last line
    clock.now += 5
    assert progress.tick(lambda: "loaded")
    assert stream.getvalue().splitlines() == [
        "reminder-pipeline: loading",
        "reminder-pipeline: loaded",
    ]
    assert progress.lines == 2


def test_the_drain_line_has_rows_done_rows_per_second_and_backlog_left():
    clock, stream = Clock(), io.StringIO()
    progress = ProgressLine(stream, every_seconds=5, clock=clock)
    assert not progress.rows(1_000, 99_000)
    clock.now += 10
    assert progress.rows(60_000, 40_000)
    assert stream.getvalue().strip() == (
        "reminder-pipeline: drain: 60,000 rows done, 6,000 rows/s, 40,000 left (10 s)"
    )
    clock.now += 5
    assert progress.rows(60_000, None)
    assert stream.getvalue().splitlines()[-1].endswith("backlog unknown (15 s)")


def test_an_interval_of_zero_writes_every_step():
    stream = io.StringIO()
    progress = ProgressLine(stream, every_seconds=0, clock=Clock())
    assert progress.tick("a") and progress.tick("b")
    assert len(stream.getvalue().splitlines()) == 2
