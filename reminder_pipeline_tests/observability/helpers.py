"""Helpers of the observability tests.

Shared helpers: scraping the real HTTP endpoint, and context managers capturing the package's
JSON log lines and its finished spans (in memory).
"""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from reminder_pipeline.config import Settings
from reminder_pipeline.local.endpoints import Endpoints
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.logs import JsonFormatter
from reminder_pipeline.observability import tracing


@dataclass
class Scrape:
    """One scrape of ``/metrics``: the raw text and the parsed samples."""

    text: str
    families: dict[str, Any]

    def value(self, sample: str, **labels: str) -> float | None:
        """The value of the sample named ``sample`` with exactly these labels (None if absent)."""
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and dict(s.labels) == labels:
                    return s.value
        return None

    def buckets(self, histogram: str) -> dict[str, float]:
        """A histogram's cumulative buckets by ``le``."""
        family = self.families[histogram]
        return {s.labels["le"]: s.value for s in family.samples if s.name == histogram + "_bucket"}

    def sample_families(self) -> set[str]:
        """Names of the metric families as exposed (counters with their ``_total``)."""
        names = set()
        for name, family in self.families.items():
            names.add(name + "_total" if family.type == "counter" else name)
        return names


def scrape(url: str) -> Scrape:
    """GET ``url`` and parse it with prometheus_client's own text parser."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return Scrape(text, {f.name: f for f in text_string_to_metric_families(text)})


def exporter_settings(database_url: str) -> tuple[Settings, Endpoints]:
    """Settings on a free metrics port and endpoints naming the test's database."""
    settings = Settings.from_env({"REMINDER_METRICS_PORT": str(free_port())})
    return settings, Endpoints(database_url=database_url, dagster_pg_url="", bootstrap_servers="")


@contextmanager
def captured_spans() -> Iterator[InMemorySpanExporter]:
    """Spans finished inside the block, kept in memory (added to the process's SDK provider)."""
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    tracing.provider().add_span_processor(processor)
    try:
        yield exporter
    finally:
        processor.shutdown()


@contextmanager
def captured_json_logs() -> Iterator[io.StringIO]:
    """What the ``reminder_pipeline`` logger writes in the block, as the production JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("reminder_pipeline")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def log_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """The captured JSON log lines, parsed (each line must be one JSON object)."""
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
