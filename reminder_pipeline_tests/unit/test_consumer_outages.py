"""An outage of a server the consumer needs: one line each way, counted once, probed with capped
back-off (``consumer/outages.py``; the real restart is ``consumer/test_dedup_store_outage.py``)."""

from __future__ import annotations

import logging

import pytest

from reminder_pipeline.consumer import metrics as m
from reminder_pipeline.consumer.metrics import ConsumerMetrics
from reminder_pipeline.consumer.outages import MAX_PROBE_SECONDS, Outage


def test_an_outage_is_logged_and_counted_once_and_probed_with_capped_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    metrics = ConsumerMetrics()
    outage = Outage("broker", metrics, group_id="g", first_probe_seconds=0.5)

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"dependency": "broker"})

    assert not outage.active and outage.seconds_to_probe(0.0) is None
    assert sample(m.DEPENDENCY_UP) == 1 and sample(m.OUTAGES) == 0
    for now in (10.0, 10.1, 10.2):  # every message failing the same way: one outage
        outage.begin("_ALL_BROKERS_DOWN", now)
    assert outage.active and sample(m.DEPENDENCY_UP) == 0 and sample(m.OUTAGES) == 1
    assert not outage.probe_due(10.4) and outage.probe_due(10.5)
    waits = []
    now = 10.5
    for _ in range(8):
        outage.probe_failed(now)
        waits.append(outage.next_probe_at - now)
        now = outage.next_probe_at
    assert waits[:3] == [1.0, 2.0, 4.0] and max(waits) == MAX_PROBE_SECONDS
    outage.end(now)
    outage.end(now + 1)  # already over: nothing more
    assert not outage.active and sample(m.DEPENDENCY_UP) == 1 and sample(m.OUTAGES) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("dependency unavailable; its work is held until it answers") == 1
    assert lines.count("dependency available again; held work resumes") == 1
