"""Real dropped packets (iptables in a network namespace of the test's own, no proxy) under the
relay and the metrics exporter, each on an embedded PostgreSQL (and broker) of its own:

* a relay holding the relay lock whose lock session's packets are dropped after the broker
  acknowledged its batch fails in one line within 30 s, the server ends the session and its lock
  (``idle_session_timeout`` on the lock session) within 30 s, another dispatcher started while
  the lock was held publishes its rows and the stuck relay's within its cycle, and no row is
  marked published without its message on the topic (``scenario_relay_drop``);
* every scrape while the exporter's database is black-holed answers within Prometheus' 10 s with
  ``up 0``, and once the packets flow again the next scrapes say ``up 1``
  (``scenario_exporter_drop``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from reminder_pipeline.cli.exits import EXIT_FAILURE
from reminder_pipeline_testkit.netns import require_netns, run_in_own_network

pytestmark = [pytest.mark.server, pytest.mark.slow]

#: The promise: a silent peer is noticed, and whatever it held let go, within 30 s.
PROMISE_SECONDS = 30.0
#: Prometheus' default scrape timeout.
SCRAPE_TIMEOUT = 10.0


def run_scenario(module: str) -> dict[str, Any]:
    """Run a scenario module of this folder in its own network namespace; its JSON findings."""
    require_netns()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = run_in_own_network(
        [sys.executable, "-m", f"reminder_pipeline_tests.faults.{module}"], env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_relay_whose_lock_session_packets_are_dropped_lets_go_and_another_publishes() -> None:
    found = run_scenario("scenario_relay_drop")
    assert found["held_at_drop"], found
    # The stuck relay ends (its read bound, the kernel's tcp_user_timeout) with one line, exit 1.
    assert found["stuck_ended_seconds"] is not None, found
    assert found["stuck_ended_seconds"] < PROMISE_SECONDS, found
    assert found["stuck_exit_code"] == EXIT_FAILURE, found
    assert "\n" not in found["stuck_error_line"], found
    # The server ends the silent lock session, and the lock with it: server-timed.
    assert found["lock_freed_seconds"] < PROMISE_SECONDS, found
    # The other dispatcher's cycle waited for the lock, then published its rows and the stuck
    # relay's: nothing left, nothing failed, every row marked.
    relay = found["other_relay"]
    assert relay is not None, found
    assert relay["busy"] and relay["left"] == 0 and relay["failed"] == 0, found
    assert found["other_sent"] == 10, found
    assert found["outbox"] == found["marked"] == found["due"], found
    # Nothing marked published that the broker did not acknowledge (a copy is at least once).
    assert found["marked_not_on_topic"] == [], found


def test_scrapes_answer_within_10_s_while_the_exporter_database_packets_are_dropped() -> None:
    found = run_scenario("scenario_exporter_drop")
    assert found["up_before"] == 1, found
    assert all(up == 0 for up in found["during_up"]), found  # None: no answer within 10 s
    assert max(found["during_seconds"]) < SCRAPE_TIMEOUT, found
    # Healed: the next scrapes once the packets flow again (a pooled session that waited
    # through the drop is answered or closed by its read bound, a new one connects).
    assert found["up_after"] == 1, found
    assert found["healed_seconds"] < PROMISE_SECONDS, found
