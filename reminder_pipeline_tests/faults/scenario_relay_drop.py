"""Packet-drop scenario: a relay holding the relay lock whose lock session is black-holed.

Run in a network namespace of its own (``reminder_pipeline_testkit.netns.run_in_own_network``), from
the repository root: ``python -m reminder_pipeline_tests.faults.scenario_relay_drop``. It starts an
embedded PostgreSQL and an embedded broker, lets a relay publish a dispatch's rows and, once the
broker acknowledged them and before the relay marks them published, drops the packets of that
relay's lock session only (its client port, found in ``pg_stat_activity``; iptables, both ways).
Another dispatcher, started while the lock is held, runs a cycle over the same database. It prints
one JSON line: how and when the stuck relay ended (the CLI's exit code and one line), when the
server let go of the lock, what the other cycle's relay did, and whether every row marked published
has its message on the topic. The server is watched through its Unix socket, which the drop does not
touch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.cli.exits import exit_code, message
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.messaging.relay import publish_outbox
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine
from reminder_pipeline_testkit.netns import drop_port, undrop_port
from reminder_pipeline_tests.faults.test_stuck_relay import in_thread, lock_held
from reminder_pipeline_tests.support import KafkaReader, bulk_due, outbox_rows, utcnow

STUCK_APP = "stuck-relay"
#: Reminders the stuck relay publishes, and those the other dispatcher sends while it is stuck.
STUCK_DUE, OTHER_DUE = 20, 10
WAIT_SECONDS = 60.0


@contextmanager
def own_servers(prefix: str, *, broker: bool) -> Iterator[tuple[EmbeddedPostgres, sa.Engine]]:
    """An embedded PostgreSQL (database ``app``, migrated) and, with ``broker``, an embedded
    broker with the contract's topic (``KAFKA_BOOTSTRAP_SERVERS`` set to it), in a temporary
    directory outside pytest's; yields the server and a watcher engine on its Unix socket.
    Everything is stopped at the end: a namespace lives as long as a process in it."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(data_dir=root / "data", port=free_port())
    kafka = EmbeddedBroker(state_dir=root / "broker", port=free_port()) if broker else None
    try:
        server.start()
        if kafka is not None:
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka.start()
            ensure_topic(kafka_settings())
        server.ensure_database("app")
        socket = (
            f"postgresql+psycopg://postgres@/app?host={server._socket_dir()}&port={server.port}"
        )
        watcher = make_engine(socket, pool_size=1, application_name="watcher")
        migrate.upgrade(watcher)
        try:
            yield server, watcher
        finally:
            watcher.dispose()
    finally:
        if kafka is not None:
            kafka.stop()
        server.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def kafka_settings() -> KafkaSettings:
    """The settings of the broker :func:`own_servers` started."""
    return KafkaSettings.from_env(os.environ, os.environ["KAFKA_BOOTSTRAP_SERVERS"])


def _relay_client_port(watcher: sa.Engine) -> int:
    """The client port of the relay's lock session (its application name says ``relay``)."""
    with watcher.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT client_port FROM pg_stat_activity WHERE application_name LIKE :name"
                ),
                {"name": f"{STUCK_APP} relay %"},
            ).scalar_one()
        )


def scenario(server: EmbeddedPostgres, watcher: sa.Engine) -> dict[str, Any]:
    """The stuck relay, the drop, the other dispatcher's cycle, the topic read back."""
    settings = kafka_settings()
    bulk_due(watcher, STUCK_DUE)
    cycle.drain(watcher, utcnow(), 1000)  # the stuck relay's rows, written and unpublished
    stuck_engine = make_engine(server.url("app"), application_name=STUCK_APP)
    stuck_publisher = KafkaPublisher(settings)
    dropped = {"port": 0, "at": 0.0, "ended": 0.0}

    def drop_lock_session(_ids: list[int]) -> None:  # acknowledged; the mark never arrives
        if dropped["at"]:
            return
        dropped["port"] = _relay_client_port(watcher)
        drop_port(int(dropped["port"]))
        dropped["at"] = time.monotonic()

    def stuck_relay() -> Any:
        try:
            return publish_outbox(
                stuck_engine,
                stuck_publisher,
                run_id="stuck-run",
                on_acknowledged=drop_lock_session,
            )
        finally:
            dropped["ended"] = time.monotonic()

    stuck, stuck_outcome = in_thread(stuck_relay)
    while not dropped["at"] and stuck.is_alive():
        time.sleep(0.05)
    held_at_drop = lock_held(watcher)

    # Another dispatcher, over TCP like the stuck one (its own connections are not dropped).
    bulk_due(watcher, OTHER_DUE)
    other_engine = make_engine(server.url("app"), application_name="other-dispatcher")
    other_publisher = KafkaPublisher(settings)
    other, other_outcome = in_thread(
        lambda: cycle.run_cycle(other_engine, other_publisher, budget_seconds=WAIT_SECONDS)
    )

    while lock_held(watcher) and time.monotonic() - dropped["at"] < WAIT_SECONDS:
        time.sleep(0.2)
    freed = time.monotonic() - dropped["at"]
    stuck.join(max(WAIT_SECONDS - (time.monotonic() - dropped["at"]), 0.0))
    stuck_ended = dropped["ended"] - dropped["at"] if dropped["ended"] else None
    other.join(WAIT_SECONDS)
    undrop_port(int(dropped["port"]))

    report = other_outcome.get("result")
    error = stuck_outcome.get("error")
    rows = outbox_rows(watcher)
    marked = {str(o["reminder_id"]) for o in rows if o["published_at"] is not None}
    reader = KafkaReader(settings)
    on_topic = Counter(m.value["ReminderId"] for m in reader.wait_for(marked))
    reader.close()
    stuck_publisher.close(timeout=0)
    other_publisher.close()
    stuck_engine.dispose()
    other_engine.dispose()
    return {
        "due": STUCK_DUE + OTHER_DUE,
        "held_at_drop": held_at_drop,
        "stuck_ended_seconds": None if stuck_ended is None else round(stuck_ended, 1),
        "stuck_result": None if "result" not in stuck_outcome else stuck_outcome["result"].plain(),
        "stuck_exit_code": None if error is None else exit_code(error),
        "stuck_error_line": None if error is None else message(error),
        "lock_freed_seconds": round(freed, 1),
        "other_error": None if report is not None else repr(other_outcome.get("error")),
        "other_relay": None if report is None else report.relay.plain(),
        "other_sent": None if report is None else report.counts.sent,
        "outbox": len(rows),
        "marked": len(marked),
        "marked_not_on_topic": sorted(marked - set(on_topic)),
        "on_topic_twice": sum(n > 1 for n in on_topic.values()),
    }


def main() -> None:
    """Run the scenario on servers of its own and print the findings as one JSON line."""
    with own_servers("rp-relay-drop-", broker=True) as (server, watcher):
        findings = scenario(server, watcher)
    print(json.dumps(findings), flush=True)


if __name__ == "__main__":
    main()
