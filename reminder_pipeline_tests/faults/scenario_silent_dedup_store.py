"""Packet-drop scenario: the consumer's shared de-dup store (PostgreSQL) black-holed mid-use.

Run in a network namespace of its own (``reminder_pipeline_testkit.netns.run_in_own_network``), from
the repository root: ``python -m reminder_pipeline_tests.faults.scenario_silent_dedup_store``. It
starts an embedded PostgreSQL with the store made as compose makes it, opens the store, drops the
port's packets both ways (iptables), asks the store what a batch asks, probes it once more during
the drop, lets the packets through and probes again; prints one JSON line: whether the question
became an outage (``DedupStoreUnavailable``, which the consumer announces) and after how many
seconds, what the probe during the drop got, and whether the store answers after.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from reminder_pipeline.consumer import PostgresDedupStore
from reminder_pipeline.consumer.dedup import DedupStoreUnavailable
from reminder_pipeline.local.servers import EmbeddedPostgres
from reminder_pipeline_testkit.dedup_store import dedup_database
from reminder_pipeline_testkit.netns import drop_port, undrop_port
from reminder_pipeline_tests.faults.scenarios import run_on_own_server


def scenario(server: EmbeddedPostgres) -> dict[str, Any]:
    """The store asked during the drop, probed during it, probed after it."""
    with dedup_database(server.url("postgres")) as url, PostgresDedupStore(url) as store:
        store.known([uuid.uuid4()])
        drop_port(server.port)
        started = time.monotonic()
        try:
            store.known([uuid.uuid4()])
        except DedupStoreUnavailable:
            outage = True
        else:
            outage = False
        noticed = time.monotonic() - started
        try:
            store.ping()
        except DedupStoreUnavailable as exc:
            probe = type(exc).__name__
        else:
            probe = "answers"
        undrop_port(server.port)
        store.ping()  # a new session answers (it raises if not)
        after = "answers"
    return {
        "outage": outage,
        "noticed_seconds": round(noticed, 1),
        "probe_after_drop": probe,
        "after": after,
    }


def main() -> None:
    """Run the scenario on a server of its own and print the findings as one JSON line."""
    run_on_own_server("rp-silent-dedup-", scenario)


if __name__ == "__main__":
    main()
