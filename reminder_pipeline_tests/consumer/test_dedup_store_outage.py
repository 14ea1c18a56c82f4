"""The shared de-dup database restarted under a running consumer (issue 26): it heals by itself.

A PostgreSQL server of this test's own holds the store. The consumer notifies, the server stops
(fast shutdown: the store's session dies), reminders keep arriving, the server starts again. The
consumer must hold the partitions of what it could not check (nothing committed past them, key
order kept), log the outage once (not once per message), show it on its metrics, reconnect, and
notify every reminder once within seconds of the server answering.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from reminder_pipeline.config import ConfigError
from reminder_pipeline.consumer import ConsumerMetrics, PostgresDedupStore, ReminderConsumer
from reminder_pipeline.consumer import metrics as m
from reminder_pipeline.consumer.dedup import psycopg_dsn
from reminder_pipeline.local.servers import EmbeddedPostgres, free_port
from reminder_pipeline_testkit.dedup_store import dedup_database

from .lane import Lane, RecordingSink, a_payload, committed, wait_until

#: Generous on a loaded machine; a consumer that never reconnects fails here, not by hanging.
DEADLINE = 90.0
#: "Within seconds of the server answering": the store's probe waits at most 5 s between tries.
RESUMES_WITHIN = 30.0


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port())
    server.start()
    yield server
    server.stop()


def _await(condition, what: str, timeout: float = DEADLINE) -> None:  # type: ignore[no-untyped-def]
    wait_until(condition, then=lambda: None, timeout=timeout)
    assert condition(), f"timed out waiting for {what}"


def _records(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


def test_the_dedup_database_restarted_under_the_consumer_heals_by_itself(
    lane: Lane, own_postgres: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with dedup_database(own_postgres.url("postgres")) as url, PostgresDedupStore(url) as store:
        sink, metrics, stop = RecordingSink(), ConsumerMetrics(), threading.Event()
        consumer = ReminderConsumer(lane.kafka, sink, store, lane.options(), metrics)
        thread = threading.Thread(target=consumer.run, kwargs={"stop": stop}, daemon=True)
        thread.start()
        try:
            before = [a_payload() for _ in range(3)]
            for i, p in enumerate(before):
                lane.produce(p, partition=i)
            _await(lambda: len(sink.delivered) == 3, "the first reminders to be notified")
            _await(
                lambda: committed(lane.kafka, lane.group_id, lane.topic) == {0: 1, 1: 1, 2: 1},
                "their offsets to be committed",
            )

            own_postgres.stop()
            during = [a_payload() for _ in range(10)]
            for i, p in enumerate(during):
                lane.produce(p, partition=i % 3)
            # Every partition with a message the store could not check is held, nothing past.
            _await(lambda: consumer.held_partitions() == [0, 1, 2], "all partitions held")
            assert consumer.store_outage.active
            assert len(sink.delivered) == 3
            assert committed(lane.kafka, lane.group_id, lane.topic) == {0: 1, 1: 1, 2: 1}
            # A few failed probes while it is down (the back-off grows, the outage stays one).
            _await(lambda: consumer.store_outage.failed_probes >= 3, "probes of the store")

            own_postgres.start()
            answered = time.monotonic()
            _await(lambda: len(sink.delivered) >= 13, "every reminder notified after the restart")
            resumed_after = time.monotonic() - answered
            _await(
                lambda: committed(lane.kafka, lane.group_id, lane.topic) == {0: 5, 1: 4, 2: 4},
                "every offset committed",
            )
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not thread.is_alive()

    wanted = [p["ReminderId"] for p in before + during]
    assert sorted(sink.reminder_ids()) == sorted(wanted)  # none lost, none twice
    assert resumed_after < RESUMES_WITHIN
    # Key order: each partition's reminders notified in the order they were produced.
    for partition in range(3):
        produced = [p["ReminderId"] for i, p in enumerate(during) if i % 3 == partition]
        notified = [r for r in sink.reminder_ids() if r in produced]
        assert notified == produced
    # One outage: one line when it began, one when it ended; no line per message.
    assert _records(caplog, "dependency unavailable") == 1
    assert _records(caplog, "dependency available again") == 1
    assert _records(caplog, "message handling failed") == 0
    assert metrics.registry.get_sample_value(m.OUTAGES, {"dependency": "dedup_store"}) == 1
    assert metrics.registry.get_sample_value(m.DEPENDENCY_UP, {"dependency": "dedup_store"}) == 1
    assert metrics.registry.get_sample_value(m.DEPENDENCY_UP, {"dependency": "broker"}) == 1


def test_a_libpq_url_with_the_host_in_its_query_is_accepted(shared_dedup_url: str) -> None:
    """``postgresql://u@/db?host=/socket/dir`` is a valid libpq URL: the host is in the query."""
    assert psycopg_dsn("postgresql://u@/db?host=/run/postgresql") == (
        "postgresql://u@/db?host=/run/postgresql"
    )
    url = make_url(shared_dedup_url)
    in_query = (
        f"postgresql://{url.username}:{url.password}@/{url.database}"
        f"?host={url.host}&port={url.port}"
    )
    with PostgresDedupStore(in_query) as store:
        store.ping()
        assert store.counts() == (0, 0)
    with pytest.raises(
        ConfigError, match=r"^--dedup-url: 'postgresql://u@/db' is not a postgresql://"
    ):
        PostgresDedupStore("postgresql://u@/db")
