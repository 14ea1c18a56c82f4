"""The consumer's own Prometheus endpoint (``consume --metrics-port``), scraped over HTTP.

``consume_main`` runs against the real broker with a metrics port; after it handled a known mix
of messages (notified, a duplicate, a dead letter, a TimeZone that is not canonical, a contract
version mismatch, a reminder already overdue) the scrape shows exactly those counts, the
latency histograms, and every dead-letter reason at 0 from the start (so the first dead letter
is an increase Prometheus can alert on).
"""

from __future__ import annotations

import socket
import threading
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reminder_pipeline.cli.consume import consume_main
from reminder_pipeline.config import Settings
from reminder_pipeline.consumer import Notification
from reminder_pipeline.consumer import metrics as m
from reminder_pipeline.domain import contract

from .lane import Lane, a_payload, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class CountingSink:
    """Counts notifications; sets ``done`` once ``expect`` have been delivered."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.delivered: list[Notification] = []
        self.done = threading.Event()

    def deliver(self, notification: Notification) -> None:
        self.delivered.append(notification)
        if len(self.delivered) >= self.expect:
            self.done.set()


def _settings(lane: Lane, home: Path) -> Settings:
    return Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": lane.kafka.bootstrap_servers,
            "REMINDER_PIPELINE_HOME": str(home),
        }
    )


def test_the_metrics_endpoint_counts_what_the_consumer_did(lane: Lane, tmp_path: Path) -> None:
    """Messages by outcome, notifications, duplicates, dead letters by reason, fallbacks, latency."""
    now = datetime.now(UTC)
    notified = a_payload()
    overdue = a_payload(
        StartAt=(now + timedelta(minutes=45)).strftime("%Y-%m-%dT%H:%M:%SZ"), OffsetMinutes=60
    )  # DueAt 15 minutes ago
    host_zone = a_payload(TimeZone="localtime")
    newer = a_payload()
    for message in (notified, notified, overdue, host_zone):
        lane.produce(message, partition=0)
    lane.produce(a_payload(OwnerUserId=...), partition=1)
    lane.produce(
        newer,
        partition=2,
        headers={
            **contract.headers(newer["ReminderId"], None),
            contract.HEADER_CONTRACT_VERSION: "2",
        },
    )

    port = free_port()
    sink = CountingSink(expect=4)
    stop = threading.Event()
    codes: list[int] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            consume_main(
                _settings(lane, tmp_path / "home"),
                group_id=lane.group_id,
                sink=sink,
                stop=stop,
                options=lane.options(max_attempts=2),
                metrics_port=port,
            )
        ),
        daemon=True,
    )
    runner.start()
    try:
        wait_until(sink.done.is_set, then=lambda: None, timeout=60)
        assert sink.done.is_set(), "the consumer did not notify the four reminders"

        def dead_lettered() -> bool:
            # The dead letter is counted before its partition is released: wait for both.
            samples = scrape(port)
            return (
                samples.get((m.DEAD_LETTERS, (("reason", "incompatible"),))) == 1
                and samples.get((m.HELD_PARTITIONS, ())) == 0
            )

        wait_until(dead_lettered, then=lambda: None, timeout=60)
        samples = scrape(port)
    finally:
        stop.set()
        runner.join(timeout=30)
    assert codes == [0]

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    assert value(m.MESSAGES, outcome="notified") == 4
    assert value(m.MESSAGES, outcome="duplicate") == 1
    assert value(m.MESSAGES, outcome="dead_lettered") == 1
    assert value(m.NOTIFICATIONS, kind="CalendarReminder", recipient="owner") == 4
    assert value(m.NOTIFICATIONS, kind="AppointmentReminder", recipient="client") == 0
    assert value(m.DUPLICATES) == 1
    assert {
        reason: value(m.DEAD_LETTERS, reason=reason)
        for reason in ("unparseable", "incompatible", "unprocessable", "delivery-rejected")
    } == {"unparseable": 0, "incompatible": 1, "unprocessable": 0, "delivery-rejected": 0}
    assert value(m.TIME_ZONE_FALLBACKS) == 1
    assert value(m.VERSION_MISMATCHES) == 1
    assert value(m.RETRIES, stage="read") == 1
    # Latency: one observation per notified reminder; only the overdue one is past 10 minutes
    # (the others are due in an hour: early counts as 0).
    assert value(m.DUE_TO_NOTIFIED + "_count") == 4
    assert value(m.DUE_TO_NOTIFIED + "_bucket", le="0.25") == 3
    assert value(m.DUE_TO_NOTIFIED + "_bucket", le="600.0") == 3
    assert value(m.DUE_TO_NOTIFIED + "_bucket", le="3600.0") == 4
    assert value(m.MESSAGE_TO_NOTIFIED + "_count") == 4
    assert value(m.HELD_PARTITIONS) == 0
    assert value(m.ASSIGNED_PARTITIONS) == contract.PARTITIONS
    assert value(m.LAST_NOTIFIED) is not None and value(m.LAST_NOTIFIED) > now.timestamp() - 1
    families = {name.removesuffix("_total").removesuffix("_bucket") for name, _ in samples}
    assert {name.removesuffix("_total") for name in m.METRIC_NAMES} <= families


def test_a_metrics_port_in_use_is_a_one_line_error(
    lane: Lane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = consume_main(
            _settings(lane, tmp_path),
            group_id=f"g-{uuid.uuid4().hex[:6]}",
            once=True,
            options=lane.options(),
            metrics_port=port,
        )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"reminder-pipeline consume: --metrics-port {port}: cannot listen")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"metrics_port": 0}, "--metrics-port 0 is not a port (1..65535)"),
        ({"metrics_port": 70000}, "--metrics-port 70000 is not a port (1..65535)"),
        ({"locale": "de"}, "--locale: locale 'de' is not one of en, ru"),
    ],
)
def test_bad_consume_options_are_one_line_errors(
    lane: Lane, tmp_path: Path, capsys: pytest.CaptureFixture[str], kwargs: dict, message: str
) -> None:
    code = consume_main(_settings(lane, tmp_path), group_id="g", once=True, **kwargs)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"reminder-pipeline consume: {message}"
