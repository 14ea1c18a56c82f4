"""Test helpers shared by the suites: building events, reading the topic back, counting rows."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from sqlalchemy.engine import Engine

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.domain import contract
from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.local.calendar import NewEvent, create_event
from reminder_pipeline.observability import ledger
from reminder_pipeline.store import metrics_repository
from reminder_pipeline.store.tables import calendar_events, event_reminders, outbox

PII_TITLE = "Secret deal with Ivanov"
PII_DESCRIPTION = "Call +7 900 000-00-00 about the flat on Tverskaya"
PII_LOCATION = "Tverskaya 1, apt 42"
#: A kind longer than the contract's 64 characters: the row's message breaks the contract, so the
#: row is a poison row (excluded, left Pending with a back-off, retried later).
POISON_KIND = "K" * 65


def utcnow() -> datetime:
    """The clock, UTC."""
    return datetime.now(UTC)


def record_cycle_at(
    engine: Engine, run_id: str, counts: CycleCounts | None, finished_at: datetime, **record: Any
) -> None:
    """A ledger row for a cycle that finished at ``finished_at`` (no roll-up runs).

    The ledger stamps its rows with the database's clock; a test that needs cycles at chosen
    moments writes the row as the ledger does and moves it, in one transaction.
    """
    row = ledger.build_record(run_id, counts, **record)
    with engine.begin() as conn:
        stamped = metrics_repository.insert_cycle(conn, row)
        conn.execute(
            sa.text(
                "UPDATE dispatch_cycles SET finished_at = :at, "
                "started_at = started_at + (:at - finished_at) "
                "WHERE run_id = :run_id AND finished_at = :stamped"
            ),
            {"at": finished_at, "run_id": run_id, "stamped": stamped},
        )


def make_event(
    engine: Engine,
    *,
    start_at: datetime,
    offsets: Iterable[int] = (60,),
    now: datetime | None = None,
    **overrides: Any,
) -> uuid.UUID:
    """Create an event with PII-looking text fields and the given reminder offsets."""
    fields = {
        "tenant_id": uuid.uuid4(),
        "owner_user_id": uuid.uuid4(),
        "kind": "Meeting",
        "start_at": start_at,
        "time_zone": "Europe/Moscow",
        "title": PII_TITLE,
        "description": PII_DESCRIPTION,
        "location": PII_LOCATION,
    }
    fields.update(overrides)
    return create_event(engine, NewEvent(**fields), offsets, now=now)


def make_due_event(
    engine: Engine, *, minutes_overdue: float = 1, offsets=(60,), **kw: Any
) -> uuid.UUID:
    """An event whose single reminder became due ``minutes_overdue`` ago (created before that)."""
    now = utcnow()
    offset = max(offsets)
    start_at = now - timedelta(minutes=minutes_overdue) + timedelta(minutes=offset)
    created = now - timedelta(days=2)
    return make_event(engine, start_at=start_at, offsets=offsets, now=created, **kw)


def bulk_due(engine: Engine, n: int) -> None:
    """``n`` due reminders of ``n`` live events, inserted set-based for speed."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                WITH ev AS (
                    INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, time_zone)
                    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Task',
                           now() + interval '30 minutes', 'UTC'
                      FROM generate_series(1, :n)
                    RETURNING id
                )
                INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at)
                SELECT gen_random_uuid(), id, 60, now() - random() * interval '10 minutes' FROM ev
                """
            ),
            {"n": n},
        )


def reminders(engine: Engine, event_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """Reminder rows (of one event, or all), oldest due first."""
    query = sa.select(event_reminders).order_by(event_reminders.c.due_at)
    if event_id is not None:
        query = query.where(event_reminders.c.calendar_event_id == event_id)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def outbox_rows(engine: Engine) -> list[dict[str, Any]]:
    """All outbox rows, in id order."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(outbox).order_by(outbox.c.id))]


def event_row(engine: Engine, event_id: uuid.UUID) -> dict[str, Any]:
    """One calendar event row."""
    with engine.connect() as conn:
        return dict(
            conn.execute(sa.select(calendar_events).where(calendar_events.c.id == event_id))
            .one()
            ._mapping
        )


def schema_differences(engine: Engine) -> list[Any]:
    """How the database's schema differs from ``tables.py``: Alembic's comparison (columns, types,
    indexes, constraints), then each table's storage parameters (``pg_class.reloptions``)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from reminder_pipeline.store.tables import metadata

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        found: list[Any] = list(compare_metadata(context, metadata))
        inspector = sa.inspect(conn)
        for name, table in metadata.tables.items():
            declared = table.dialect_options["postgresql"]["with"] or {}
            wanted = {key: str(value) for key, value in declared.items()}
            stored = inspector.get_table_options(name).get("postgresql_with", {})
            if stored != wanted:
                found.append(("storage parameters", name, stored, wanted))
    return found


@dataclass
class ReadMessage:
    """A message read back from the topic."""

    partition: int
    offset: int
    key: str
    value: dict[str, Any]
    raw_value: str
    headers: dict[str, str]


class KafkaReader:
    """Reads the contract topic from the beginning without joining a consumer group."""

    def __init__(self, settings: KafkaSettings, topic: str = contract.TOPIC) -> None:
        self.topic = topic
        self._consumer = Consumer(
            {
                **settings.client_config(),
                "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(contract.PARTITIONS)]
        )
        self.messages: list[ReadMessage] = []

    def _poll(self, timeout: float) -> None:
        for msg in self._consumer.consume(num_messages=1000, timeout=timeout):
            if msg.error():
                continue
            raw = msg.value().decode()
            self.messages.append(
                ReadMessage(
                    partition=msg.partition(),
                    offset=msg.offset(),
                    key=msg.key().decode() if msg.key() else "",
                    value=json.loads(raw),
                    raw_value=raw,
                    headers={k: v.decode() for k, v in (msg.headers() or [])},
                )
            )

    def for_reminders(self, reminder_ids: Iterable[uuid.UUID | str]) -> list[ReadMessage]:
        """Messages read so far whose ReminderId is one of ``reminder_ids``."""
        wanted = {str(r) for r in reminder_ids}
        return [m for m in self.messages if m.value.get("ReminderId") in wanted]

    def wait_for(
        self, reminder_ids: Iterable[uuid.UUID | str], timeout: float = 30.0
    ) -> list[ReadMessage]:
        """Read until a message for every id has arrived (or ``timeout``); returns theirs."""
        wanted = {str(r) for r in reminder_ids}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {m.value.get("ReminderId") for m in self.for_reminders(wanted)}
            if wanted <= seen:
                break
            self._poll(0.5)
        return self.for_reminders(wanted)

    def drain(self, idle: float = 1.0) -> None:
        """Read whatever else is there until the topic is quiet for ``idle`` seconds."""
        while True:
            before = len(self.messages)
            self._poll(idle)
            if len(self.messages) == before:
                return

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class SlowLink:
    """A TCP proxy in front of a server that delays everything the server sends by ``delay`` s.

    Throughput is kept (each chunk waits its own delay, in order); only latency grows, as on a
    slow or far-away broker.
    """

    def __init__(self, target_port: int, delay: float, port: int) -> None:
        import socket
        import threading

        self.port, self.delay, self.target_port = port, delay, target_port
        self._server = socket.create_server(("127.0.0.1", port))
        self._closed = threading.Event()
        self._sockets: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, self.delay), daemon=True
            ).start()

    def _pump(self, source, sink, delay: float) -> None:
        import queue
        import threading

        chunks: queue.Queue = queue.Queue()

        def send() -> None:
            while (item := chunks.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # the delay being simulated, not a wait for an event
                try:
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=send, daemon=True).start()
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                chunks.put(None)
                return
            chunks.put((time.monotonic() + delay, data))

    def close(self) -> None:
        """Stop accepting and cut every connection."""
        self._closed.set()
        self._server.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


def start_slow_broker(state_dir, delay: float):
    """A Tansu broker whose clients reach it only through a :class:`SlowLink` (advertised there).

    Returns (bootstrap servers, stop function).
    """
    from reminder_pipeline.local.processes import free_port
    from reminder_pipeline_testkit.fault_proxy import spawn_advertising_broker

    real, advertised = free_port(), free_port()
    _broker, stop_broker = spawn_advertising_broker(state_dir, real, advertised)
    link = SlowLink(real, delay, advertised)

    def stop() -> None:
        link.close()
        stop_broker()

    return f"127.0.0.1:{advertised}", stop


def make_event_due_on(
    engine: Engine, day: date, hour: float, *, offsets: Iterable[int] = (60,), **kw: Any
) -> uuid.UUID:
    """An event whose earliest reminder is due on ``day`` at ``hour`` UTC (created 10 days before)."""
    offsets = tuple(offsets)
    first_due = datetime.combine(day, clock_time(0), tzinfo=UTC) + timedelta(hours=hour)
    start_at = first_due + timedelta(minutes=max(offsets))
    return make_event(
        engine, start_at=start_at, offsets=offsets, now=first_due - timedelta(days=10), **kw
    )


def wait_for_republished(
    reader: KafkaReader, reminder_ids: Iterable[uuid.UUID | str], count: int, timeout: float = 30.0
) -> list[ReadMessage]:
    """Re-published messages (``republished-by-run`` header) of ``reminder_ids``, once ``count`` arrived."""
    from reminder_pipeline.operator_jobs.republish import HEADER_REPUBLISHED_BY_RUN

    wanted = {str(r) for r in reminder_ids}
    deadline = time.monotonic() + timeout
    while True:
        found = [m for m in reader.for_reminders(wanted) if HEADER_REPUBLISHED_BY_RUN in m.headers]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        reader._poll(0.5)


@dataclass
class PublishedDays:
    """Reminders due on two past days, dispatched and published by real cycles (the back-fill's input)."""

    days: tuple[date, date]
    published: dict[date, list[str]]  # reminder ids of the day's published outbox rows
    unpublished: str | None  # due on the first day, its outbox row not published (the relay's)
    day_before: str  # published, due the day before the first: never part of the back-fill


def publish_two_days(
    engine: Engine, publisher: Any, now: datetime, *, with_unpublished: bool = True
) -> PublishedDays:
    """Reminders on ``now`` - 2 and - 1 days (several per key, one key on both days), sent and published.

    ``with_unpublished`` adds one more due on the first day whose outbox row is not published.
    """
    first, second = (now - timedelta(days=2)).date(), (now - timedelta(days=1)).date()
    events = [
        make_event_due_on(engine, first, 0.0),  # the day's first instant belongs to it
        make_event_due_on(engine, first, 9, offsets=(120, 60, 30)),  # one key, three reminders
        make_event_due_on(engine, first, 6, offsets=(1440, 60)),  # one key, due on both days
        make_event_due_on(engine, first, 23.99),
        make_event_due_on(engine, second, 0.0),
        make_event_due_on(engine, second, 14, offsets=(90, 45)),
        make_event_due_on(engine, second, 23.5, client_user_id=uuid.uuid4()),
    ]
    before = make_event_due_on(engine, first - timedelta(days=1), 23.9)
    from reminder_pipeline import cycle

    report = cycle.run_cycle(engine, publisher, batch_size=1000)
    assert report.counts.failed == 0 and report.relay.failed == 0
    unpublished = make_event_due_on(engine, first, 12) if with_unpublished else None
    cycle.run_cycle(engine, None, batch_size=1000)  # written to the outbox, never relayed
    published: dict[date, list[str]] = {first: [], second: []}
    for row in outbox_rows(engine):
        assert row["due_at"] is not None
        if row["published_at"] is not None and row["due_at"].date() in published:
            published[row["due_at"].date()].append(str(row["reminder_id"]))
    assert [len(published[first]), len(published[second])] == [6, 5], events
    return PublishedDays(
        days=(first, second),
        published=published,
        unpublished=str(reminders(engine, unpublished)[0]["id"]) if unpublished else None,
        day_before=str(reminders(engine, before)[0]["id"]),
    )


# --- the CLI as a process ------------------------------------------------------------------------

#: The settings that name servers: a CLI test passes exactly the ones it means.
SERVER_VARIABLES = ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL")


def run_cli(
    *args: str, env: dict[str, str], command: Sequence[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``reminder-pipeline ARGS`` (or ``command ARGS``) with exactly the server settings in
    ``env``, no stdin, its output captured."""
    base = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    return subprocess.run(
        [*(command or (sys.executable, "-m", "reminder_pipeline.cli")), *args],
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The one-line errors the command printed."""
    return [
        line for line in result.stderr.splitlines() if line.startswith("reminder-pipeline: error")
    ]


def up_env(home: Path, **more: str) -> dict[str, str]:
    """The environment of a real ``reminder-pipeline up`` under ``home``: its own embedded servers,
    webserver and exporter on free ports, none of the test session's server settings."""
    from reminder_pipeline.local.servers import free_port

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "DAGSTER_PG_URL", "DAGSTER_HOME")
    }
    env.update(
        REMINDER_PIPELINE_HOME=str(home),
        REMINDER_EMBEDDED_PG_PORT=str(free_port()),
        REMINDER_EMBEDDED_BROKER_PORT=str(free_port()),
        DAGSTER_WEBSERVER_PORT=str(free_port()),
        REMINDER_METRICS_PORT=str(free_port()),
        **more,
    )
    return env


def insert_as_another_writer(conn: sa.Connection, spec: dict[str, Any]) -> uuid.UUID:
    """An event and its one reminder inserted straight into the tables, as another writer could.

    ``spec``: kind, status, client / appointment (bools: an id or NULL), start_at (a datetime or
    a PostgreSQL timestamptz literal such as 'infinity'), time_zone, offset, due (a timedelta
    ago or a literal); origin, title, description and location are optional.
    """
    event_id, reminder_id = uuid.uuid4(), uuid.uuid4()
    start = spec["start_at"]
    conn.execute(
        sa.text(
            "INSERT INTO calendar_events (id, tenant_id, owner_user_id, client_user_id, kind, status, "
            "origin, appointment_id, start_at, time_zone, title, description, location) VALUES "
            "(:id, :tenant, :owner, :client, :kind, :status, :origin, :appointment, "
            "CAST(:start AS timestamptz), :tz, :title, :description, :location)"
        ),
        {
            "id": event_id,
            "tenant": uuid.uuid4(),
            "owner": uuid.uuid4(),
            "client": uuid.uuid4() if spec["client"] else None,
            "appointment": uuid.uuid4() if spec["appointment"] else None,
            "kind": spec["kind"],
            "status": spec["status"],
            "origin": spec.get("origin", "Manual"),
            "start": start.isoformat() if isinstance(start, datetime) else start,
            "tz": spec["time_zone"],
            "title": spec.get("title"),
            "description": spec.get("description"),
            "location": spec.get("location"),
        },
    )
    due = spec["due"]
    due_value = (datetime.now(UTC) - due).isoformat() if isinstance(due, timedelta) else due
    conn.execute(
        sa.text(
            "INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at) "
            "VALUES (:id, :event, :offset, CAST(:due AS timestamptz))"
        ),
        {"id": reminder_id, "event": event_id, "offset": spec["offset"], "due": due_value},
    )
    return reminder_id


def read_until(proc: subprocess.Popen, needle: str, timeout: float) -> list[str]:
    """A child's stdout lines up to the first holding ``needle``; fails naming what it printed."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} not printed within {timeout:.0f}s: {lines}")


def message_at(kafka_settings: Any, partition: int, offset: int, timeout: float = 60.0) -> Any:
    """The message at exactly ``partition``/``offset`` of the contract's topic (a trace's
    position read back from the broker)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    from reminder_pipeline.domain import contract

    consumer = Consumer(
        {
            **kafka_settings.client_config(),
            "group.id": f"read-back-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(contract.TOPIC, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                assert (msg.partition(), msg.offset()) == (partition, offset)
                return msg
        raise AssertionError(f"nothing at partition {partition} offset {offset}")
    finally:
        consumer.close()
