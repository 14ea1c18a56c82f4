"""Dagster's daemon heartbeats on the metrics endpoint: their age per daemon, from a real instance.

Heartbeats written to a real Dagster instance's storage (what ``dagster-daemon`` writes every
30 s) are read through the public instance API and served as
``calendar_reminder_dispatch_daemon_heartbeat_age_seconds{daemon}``, in process and by
``reminder-pipeline metrics`` run with ``DAGSTER_HOME`` naming the instance; a heartbeat store
that cannot be read leaves the dispatcher's metrics served, and one that does not answer costs a
read its bounded wait, not more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest
from dagster import DagsterInstance, instance_for_test

# Test-only: the record dagster-daemon writes (its module is not public API; the code reads it
# through the public ``instance.get_daemon_heartbeats()``).
from dagster._daemon.types import DaemonHeartbeat

from reminder_pipeline.defs.heartbeats import instance_heartbeats
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import metric_names
from reminder_pipeline_tests.observability.helpers import exporter_settings, scrape


def beat(instance: DagsterInstance, daemon: str, seconds_ago: float) -> None:
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - seconds_ago, daemon, "test"))


def test_the_exporter_serves_each_daemons_heartbeat_age(database_url: str) -> None:
    with instance_for_test() as instance:
        beat(instance, "SCHEDULER", 200)
        beat(instance, "SENSOR", 5)
        settings, endpoints = exporter_settings(database_url)
        running = exp.start_exporter(settings, endpoints, heartbeats=instance_heartbeats(instance))
        try:
            scraped = scrape(running.url)
        finally:
            running.stop()
    scheduler = scraped.value(exp.DAEMON_HEARTBEAT_AGE, daemon="SCHEDULER")
    sensor = scraped.value(exp.DAEMON_HEARTBEAT_AGE, daemon="SENSOR")
    assert scheduler is not None and 200 <= scheduler < 260
    assert sensor is not None and sensor < 60
    assert scraped.value(exp.UP) == 1


def test_heartbeats_that_cannot_be_read_leave_the_other_metrics_served(database_url: str) -> None:
    def broken() -> dict[str, float]:
        raise ConnectionError("dagster storage down")

    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints, heartbeats=broken)
    try:
        scraped = scrape(running.url)
    finally:
        running.stop()
    assert exp.DAEMON_HEARTBEAT_AGE not in scraped.families
    # Everything else is served (the last success is absent until a cycle has succeeded; the
    # xmin horizon's holder while something holds it).
    held = set(metric_names.WHILE_HELD_METRIC_NAMES)
    assert scraped.sample_families() - held == set(exp.DISPATCH_METRIC_NAMES) - held - {
        exp.LAST_SUCCESS
    }


def test_the_metrics_command_reads_the_instance_dagster_home_names(
    database_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with DagsterInstance.from_config(str(home)) as instance:
        beat(instance, "SCHEDULER", 400)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REMINDER_METRICS_PORT": str(port),
        "DAGSTER_HOME": str(home),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "reminder_pipeline.cli", "metrics"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scraped = scrape(f"http://127.0.0.1:{port}/metrics")
                # A scrape awaits the instance's opening (begun at the start) 3 s at most.
                if exp.DAEMON_HEARTBEAT_AGE in scraped.families:
                    break
            except OSError:
                assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no heartbeats served within 60 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    age = scraped.value(exp.DAEMON_HEARTBEAT_AGE, daemon="SCHEDULER")
    assert age is not None and age >= 400


class _Unanswered:
    """An instance whose storage answers only once released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.reads = 0

    def get_daemon_heartbeats(self) -> dict[str, DaemonHeartbeat]:
        self.reads += 1
        self.release.wait()
        return {"SCHEDULER": DaemonHeartbeat(123.0, "SCHEDULER", "test")}


def test_a_storage_that_does_not_answer_costs_a_read_its_wait_and_one_read_goes_on() -> None:
    storage = _Unanswered()
    read = instance_heartbeats(cast(DagsterInstance, storage), wait_seconds=0.5)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            read()
    assert storage.reads == 1  # the second read awaited the first, it did not start another
    storage.release.set()
    deadline = time.monotonic() + 60
    while True:
        try:
            assert read() == {"SCHEDULER": 123.0}
            break
        except TimeoutError:
            assert time.monotonic() < deadline, "the read never answered after the release"
