"""JSON log lines: one per event, and one per item of a batch record (logs.events)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from reminder_pipeline import logs


@pytest.fixture
def captured():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("reminder_pipeline.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield logger, stream
    logger.removeHandler(handler)


def test_a_batch_record_is_one_line_per_item_with_the_common_fields(captured):
    logger, stream = captured
    items = [{"reminder_id": f"r{i}", "event_id": f"e{i}", "offset_minutes": i} for i in range(3)]
    logs.events(logger, logging.INFO, "reminder sent", items, run_id="run-1")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["reminder_id"] for line in lines] == ["r0", "r1", "r2"]
    for line, item in zip(lines, items, strict=True):
        assert line["msg"] == "reminder sent" and line["run_id"] == "run-1"
        assert line["level"] == "INFO" and line["logger"] == "reminder_pipeline.test_logs"
        assert {k: line[k] for k in item} == item


def test_an_item_cannot_shadow_a_common_field_into_invalid_json(captured):
    logger, stream = captured
    logs.events(
        logger, logging.INFO, "reminder skipped", [{"msg": "other", "x": 1}, {}], run_id="r"
    )
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "other" and first["x"] == 1  # the item wins, once
    assert second["msg"] == "reminder skipped"


def test_nothing_is_logged_for_no_items_or_below_the_level(captured):
    logger, stream = captured
    logs.events(logger, logging.INFO, "reminder sent", [], run_id="r")
    logs.events(logger, logging.DEBUG, "reminder sent", [{"a": 1}], run_id="r")
    assert stream.getvalue() == ""


def test_values_json_cannot_hold_still_make_a_line(captured):
    logger, stream = captured
    logs.event(logger, logging.INFO, "odd", big=2**70, obj=object(), inf=float("inf"))
    line = json.loads(stream.getvalue())
    assert line["big"] == 2**70 and line["obj"].startswith("<object")
