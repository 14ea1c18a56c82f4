"""OpenTelemetry traces: a span per cycle, item events with tenant ids, W3C context in messages.

* The cycle span (``reminder_dispatch.cycle``) carries the run id as the correlation id; every
  reminder sent, skipped or failed is an event on it with its ids and tenant id.
* The current span's W3C ``traceparent`` is stored in the outbox headers when the message is
  written, and the relay sends those headers to Kafka, so a consumer continues the trace
  (:func:`context_from_headers`) even when the message is published cycles later.
* Identifiers and counts only: no title, description or location ever becomes an attribute.

An SDK tracer provider is always installed (so trace ids exist and propagate), but exporting is
off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set, in which case
spans go out over OTLP/HTTP in the background. Tests add an in-memory exporter to
:func:`provider`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

CYCLE_SPAN = "reminder_dispatch.cycle"
TRACER_NAME = "reminder_pipeline"
SERVICE_NAME = "reminder-pipeline"
ATTR_CORRELATION_ID = "correlation_id"
ATTR_RUN_ID = "reminder_dispatch.run_id"
ATTR_PREFIX = "reminder_dispatch."
#: Item events per cycle span kept before the SDK drops the rest (its default, 128, is less than
#: one default batch); the cycle's counts are attributes, so nothing is lost but the per-item ids.
MAX_ITEM_EVENTS = 2048

# Only the W3C trace context is propagated, on purpose: a global propagator configured with
# baggage could carry arbitrary (personal) data into every message.
_PROPAGATOR = TraceContextTextMapPropagator()
_lock = threading.Lock()
_provider: SdkTracerProvider | None = None


def _build_provider(env: Mapping[str, str]) -> SdkTracerProvider:
    # Resource.create() also reads OTEL_RESOURCE_ATTRIBUTES; OTEL_SERVICE_NAME wins when set.
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    provider = SdkTracerProvider(
        resource=Resource.create(attributes), span_limits=SpanLimits(max_events=MAX_ITEM_EVENTS)
    )
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        # Imported only when exporting, and the exporter reads the endpoint/headers env itself.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def provider() -> SdkTracerProvider:
    """The SDK tracer provider: the global one if it is an SDK one, else ours (made global)."""
    global _provider
    with _lock:
        if _provider is None:
            current = trace.get_tracer_provider()
            if isinstance(current, SdkTracerProvider):
                _provider = current
            else:
                _provider = _build_provider(os.environ)
                trace.set_tracer_provider(_provider)
        return _provider


def tracer() -> trace.Tracer:
    """The package's tracer."""
    return provider().get_tracer(TRACER_NAME)


def _clean(fields: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Attribute-safe values (ids as strings, counts as numbers); None dropped."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in fields.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str | int | float | bool) else str(value)
    return out


@contextmanager
def cycle_span(run_id: str, **attributes: Any) -> Iterator[Span]:
    """Run the block in the cycle span (current), with ``run_id`` as the correlation id.

    An exception marks the span failed with the exception's class name only (its message could
    hold data), then propagates.
    """
    attrs: dict[str, str | int | float | bool] = {ATTR_CORRELATION_ID: run_id, ATTR_RUN_ID: run_id}
    attrs.update({ATTR_PREFIX + k: v for k, v in _clean(attributes).items()})
    with tracer().start_as_current_span(
        CYCLE_SPAN, attributes=attrs, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except Exception as exc:
            span.add_event("exception", {"exception.type": type(exc).__name__})
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def set_attributes(**fields: Any) -> None:
    """Set ``reminder_dispatch.*`` attributes (counts, ids) on the current span, if recording."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({ATTR_PREFIX + k: v for k, v in _clean(fields).items()})


def item_event(name: str, **ids: Any) -> None:
    """Add a per-item event (reminder, event and tenant ids) to the current span, if recording."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, _clean(ids))


def item_events(name: str, items: list[dict[str, Any]]) -> None:
    """:func:`item_event` for each item, until the span holds ``MAX_ITEM_EVENTS`` events.

    The SDK would build every further event and then drop it; stopping at the limit saves that.
    """
    span = trace.get_current_span()
    if not items or not span.is_recording():
        return
    held = getattr(span, "events", None)
    room = MAX_ITEM_EVENTS - (len(held) if held is not None else 0)
    for ids in items[: max(room, 0)]:
        span.add_event(name, _clean(ids))


def trace_headers() -> dict[str, str]:
    """The current span's W3C context (``traceparent``, maybe ``tracestate``); empty if none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def context_from_headers(headers: Mapping[str, str | bytes] | None) -> Context:
    """A context continuing the trace of a message's headers (for a consumer's span)."""
    carrier = {
        k.lower(): v.decode() if isinstance(v, bytes) else str(v)
        for k, v in (headers or {}).items()
    }
    return _PROPAGATOR.extract(carrier)
