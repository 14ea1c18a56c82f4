"""Identifiers only: no title, description or location value reaches a JSON log line, a span, a message or a metric.

Real cycles (sent, skipped, poison and failed paths) run over events whose text fields hold
distinctive strings; everything the system emits is captured as production emits it (the JSON
log formatter, the span exporter, the broker, the metrics endpoint) and searched for them. The
same run checks the seed's log events carry the identifiers they promise.
"""

from __future__ import annotations

import json
import uuid

import pytest

from reminder_pipeline import cycle
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import tracing

from ..support import POISON_KIND, make_due_event, outbox_rows, reminders
from .helpers import captured_json_logs, captured_spans, exporter_settings, log_lines, scrape

MARK = uuid.uuid4().hex[:10]
SECRETS = {
    "title": f"Title-PII-{MARK} Иванов",
    "description": f"Description-PII-{MARK} +7 900 000-00-00",
    "location": f"Location-PII-{MARK} Тверская 1",
}


def _pii_event(engine, **kw):
    return make_due_event(engine, **SECRETS, **kw)


def _assert_clean(text: str, where: str) -> None:
    assert MARK not in text, f"{where} leaks a title/description/location value"
    for value in SECRETS.values():
        assert value not in text, f"{where} leaks {value!r}"


class Exploding:
    """A producer that fails outright: the failed-cycle path logs and traces too."""

    def publish(self, messages, timeout=None):
        raise RuntimeError("producer crashed")


def test_logs_spans_messages_and_metrics_carry_identifiers_only(
    engine, publisher, kafka_reader, database_url
):
    sent = [_pii_event(engine, minutes_overdue=m, client_user_id=uuid.uuid4()) for m in (1, 2)]
    skipped = _pii_event(engine, minutes_overdue=3, status="Cancelled")
    poison = _pii_event(engine, minutes_overdue=4, kind=POISON_KIND)

    with captured_json_logs() as json_logs, captured_spans() as spans:
        report = cycle.run_cycle(engine, publisher, run_id=f"run-{MARK[:4]}")
        assert (report.counts.sent, report.counts.skipped, report.counts.failed) == (2, 1, 1)
        _pii_event(engine, minutes_overdue=1)
        with pytest.raises(RuntimeError):
            cycle.run_cycle(engine, Exploding())

    # 1. The JSON log lines, exactly as production writes them.
    raw_logs = json_logs.getvalue()
    _assert_clean(raw_logs, "a log line")
    lines = log_lines(json_logs)
    assert lines, "no log line captured"

    # 2. Every span attribute and event attribute.
    finished = spans.get_finished_spans()
    assert [s.name for s in finished].count(tracing.CYCLE_SPAN) == 2
    for span in finished:
        _assert_clean(span.to_json(), f"span {span.name}")

    # 3. The stored outbox rows and the messages on the topic (value and headers).
    for row in outbox_rows(engine):
        _assert_clean(json.dumps(row, default=str), "an outbox row")
    ids = [r["id"] for e in sent for r in reminders(engine, e)]
    for message in kafka_reader.wait_for(ids):
        _assert_clean(message.raw_value + json.dumps(message.headers), "a Kafka message")

    # 4. The metrics endpoint.
    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    try:
        _assert_clean(scrape(running.url).text, "the metrics endpoint")
    finally:
        running.stop()

    # The seed's log events are there, with their identifiers.
    by_msg: dict[str, list[dict]] = {}
    for line in lines:
        by_msg.setdefault(line["msg"], []).append(line)
    started = by_msg["cycle started"][0]
    assert started["run_id"] == report.run_id and started["as_of"] == report.as_of.isoformat()
    assert by_msg["batch selected"][0]["count"] == 4
    sent_ids = {line["reminder_id"] for line in by_msg["reminder sent"]}
    assert {str(i) for i in ids} <= sent_ids
    for line in by_msg["reminder sent"]:
        assert {"reminder_id", "event_id", "offset_minutes", "tenant_id"} <= set(line)
    [skip_line] = by_msg["reminder skipped"]
    assert skip_line["event_id"] == str(skipped) and skip_line["event_status"] == "Cancelled"
    [failed] = by_msg["item failed"]
    assert failed["event_id"] == str(poison) and failed["level"] == "ERROR"
    assert "Kind" in failed["exception"]
    completed = by_msg["cycle completed"][0]
    assert (completed["sent"], completed["skipped"], completed["failed"]) == (2, 1, 1)
    assert {"duration_ms", "skipped_locked"} <= set(completed)
    [cycle_failed] = by_msg["cycle failed"]
    assert cycle_failed["error_kind"] == "RuntimeError"
