"""The consumer's CPU-time benchmark on a tiny size: it runs, and every message is notified."""

from __future__ import annotations

import logging

import pytest

from benchmarks import consumer_cpu


def test_the_cpu_figure_handles_every_message_once(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("reminder_pipeline")
    before = (list(logger.handlers), logger.level)
    assert consumer_cpu.main(["--messages", "40", "--batch", "7", "--rounds", "2", "--log"]) == 0
    out = capsys.readouterr().out
    # Half the messages have a client: 40 reminders, 60 notifications a round.
    assert "40 messages, batches of 7, 60 notifications a round, INFO lines logged;" in out
    assert "CPU per message: median" in out
    # --log leaves the package's logging as it found it (other tests configure it themselves).
    assert (list(logger.handlers), logger.level) == before
