"""OpenTelemetry traces of real cycles: one cycle span with the run id, per-item tenant ids, and the W3C context in the Kafka message.

Spans are caught with an in-memory exporter; the message is read back from the real broker and
its ``traceparent`` must carry the cycle span's trace id, so a consumer continues that trace.
"""

from __future__ import annotations

import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import StatusCode

from reminder_pipeline import cycle
from reminder_pipeline.observability import tracing

from ..support import event_row, make_due_event, outbox_rows, reminders
from .helpers import captured_spans


@pytest.fixture
def spans():
    """The spans this test finishes."""
    with captured_spans() as exporter:
        yield exporter


def _cycle_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.name == tracing.CYCLE_SPAN]


def test_a_cycle_is_one_span_with_the_run_id_and_per_item_tenant_ids(engine, publisher, spans):
    sent_event = make_due_event(engine, minutes_overdue=1)
    skipped_event = make_due_event(engine, minutes_overdue=2, status="Cancelled")

    report = cycle.run_cycle(engine, publisher, run_id="run-trace-1")
    [span] = _cycle_spans(spans)

    assert span.attributes[tracing.ATTR_CORRELATION_ID] == "run-trace-1"
    assert span.attributes[tracing.ATTR_RUN_ID] == "run-trace-1"
    assert span.attributes["reminder_dispatch.sent"] == 1
    assert span.attributes["reminder_dispatch.skipped"] == 1
    assert span.attributes["reminder_dispatch.as_of"] == report.as_of.isoformat()
    assert span.status.status_code is not StatusCode.ERROR
    by_name = {e.name: e.attributes for e in span.events}
    sent, skipped = by_name["reminder sent"], by_name["reminder skipped"]
    assert sent["tenant_id"] == str(event_row(engine, sent_event)["tenant_id"])
    assert sent["reminder_id"] == str(reminders(engine, sent_event)[0]["id"])
    assert sent["offset_minutes"] == 60
    assert skipped["tenant_id"] == str(event_row(engine, skipped_event)["tenant_id"])
    assert skipped["event_status"] == "Cancelled"


def test_the_message_carries_the_cycle_trace_so_a_consumer_can_continue_it(
    engine, publisher, kafka_reader, spans
):
    event_id = make_due_event(engine, minutes_overdue=1)
    [row] = reminders(engine, event_id)

    cycle.run_cycle(engine, publisher)
    [span] = _cycle_spans(spans)
    trace_id = format(span.context.trace_id, "032x")

    [stored] = outbox_rows(engine)
    assert stored["headers"]["traceparent"].split("-")[1] == trace_id
    [message] = kafka_reader.wait_for([row["id"]])
    version, header_trace, parent_span, flags = message.headers["traceparent"].split("-")
    assert (version, header_trace) == ("00", trace_id)
    assert int(flags, 16) & 0x01  # sampled
    assert parent_span == format(span.context.span_id, "016x")
    assert message.headers["correlation-id"] == span.attributes[tracing.ATTR_CORRELATION_ID]

    # What a consumer does: extract the context and start its span in it.
    context = tracing.context_from_headers(message.headers)
    with tracing.tracer().start_as_current_span("notifications.deliver", context=context) as child:
        assert child.get_span_context().trace_id == span.context.trace_id
    [consumer_span] = [s for s in spans.get_finished_spans() if s.name == "notifications.deliver"]
    assert consumer_span.parent.span_id == span.context.span_id


def test_a_failed_cycle_span_is_marked_with_the_exception_type_only(engine, spans):
    make_due_event(engine, minutes_overdue=1)

    class Exploding:
        def publish(self, messages, timeout=None):
            raise RuntimeError(f"secret detail {uuid.uuid4()}")

    with pytest.raises(RuntimeError):
        cycle.run_cycle(engine, Exploding())
    [span] = _cycle_spans(spans)

    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RuntimeError"
    [exception] = [e for e in span.events if e.name == "exception"]
    assert dict(exception.attributes) == {"exception.type": "RuntimeError"}
    assert "secret detail" not in repr(span.to_json())


def test_no_current_span_means_no_trace_headers():
    assert trace.get_current_span().get_span_context().is_valid is False
    assert tracing.trace_headers() == {}


def test_exporting_is_off_unless_an_otlp_endpoint_is_set():
    quiet = tracing._build_provider({})
    assert not [
        p
        for p in quiet._active_span_processor._span_processors
        if isinstance(p, BatchSpanProcessor)
    ]
    assert quiet.resource.attributes["service.name"] == tracing.SERVICE_NAME
    quiet.shutdown()

    exporting = tracing._build_provider(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SERVICE_NAME": "x"}
    )
    processors = exporting._active_span_processor._span_processors
    assert [type(p) for p in processors] == [BatchSpanProcessor]
    exporting.shutdown()  # nothing was recorded, so nothing is sent
