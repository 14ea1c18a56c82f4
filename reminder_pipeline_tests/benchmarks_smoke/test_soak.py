"""The seeded fault soak (``benchmarks.soak``): its plan is a pure function of the seed and the
minutes (no servers, seconds), its checker judges synthetic outcomes as the docs say (an empty
fault window is not a proof; after a failover a re-send with the same payload is not a double),
and a short seeded run against the real stack, every fault kind in it (packet drops in a network
namespace of its own, a stuck and a slow PostgreSQL through the fault proxy, a cut commit, a
failover to a replica that lost its last commits, a snapshot held open while the load runs),
keeps the invariants (nothing lost, nothing doubled, nothing sent after a cancel; no timing
asserts)."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from sqlalchemy.engine import Engine, make_url

from benchmarks import soak
from benchmarks._soak_check import Row, Topic, check
from benchmarks._soak_load import EventRecord
from benchmarks._soak_plan import (
    ARMED_KINDS,
    DOWN_SECONDS,
    KINDS,
    ONCE_PER_RUN,
    PACKET_DROP_KINDS,
    faults_per_kind,
    needs_own_network,
    plan_faults,
)
from benchmarks._soak_stack import FaultRecord, Stack
from reminder_pipeline.store.metrics_repository import snapshot_holders
from reminder_pipeline_testkit.netns import require_netns

from .helpers import run_benchmark

#: The suite's short run: every kind once in 3 minutes (durations scaled to a tenth).
SHORT_SEED, SHORT_MINUTES = 26, 3


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    assert plan_faults(26, 30) == plan_faults(26, 30)
    assert plan_faults(26, 30) != plan_faults(27, 30)
    assert plan_faults(26, 30) != plan_faults(26, 20)


@pytest.mark.parametrize("minutes", [2, 3, 10, 30, 45, 90])
def test_every_kind_is_planned_often_enough_one_after_another_inside_the_run(
    minutes: int,
) -> None:
    faults = plan_faults(5, minutes)
    times = [f.at_s for f in faults]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < minutes * 60
    # Twice in the 30-minute run; the failover once, whatever the length.
    counts = {k: sum(f.kind == k for f in faults) for k in KINDS}
    assert counts == {k: faults_per_kind(minutes, k) for k in KINDS}
    assert counts["failover"] == counts["long_snapshot"] == 1
    assert counts["broker_drop"] == max(1, minutes // 15)
    # No planned fault starts before the one before it is over.
    for before, after in itertools.pairwise(faults):
        assert before.at_s + before.down_s <= after.at_s, (before, after)
    assert needs_own_network(faults)


@pytest.mark.parametrize("seed", range(6))
def test_full_scale_durations_are_the_issues(seed: int) -> None:
    faults = plan_faults(seed, 30)
    for kind in ("broker_pause", "postgres_drop", "broker_drop", "dedup_drop"):
        assert all(30 <= f.down_s <= 90 for f in faults if f.kind == kind), kind
    assert all(f.down_s == 60 for f in faults if f.kind == "postgres_slow")
    # A snapshot held for several minutes, as a report or a nightly pg_dump holds one.
    assert [180 <= f.down_s <= 360 for f in faults if f.kind == "long_snapshot"] == [True]
    short = plan_faults(seed, 3)
    floors = {k: DOWN_SECONDS[k][2] for k in PACKET_DROP_KINDS | {"broker_pause"}}
    assert all(f.down_s >= floors[f.kind] for f in short if f.kind in floors)


def test_a_cut_commit_takes_both_outcomes_in_turn() -> None:
    cuts = [f.variant for f in plan_faults(26, 30) if f.kind == "cut_commit"]
    assert sorted(cuts) == ["server_commits", "server_rolls_back"]
    assert all(f.variant == "" for f in plan_faults(26, 30) if f.kind != "cut_commit")
    assert frozenset({"failover", "long_snapshot"}) == ONCE_PER_RUN


def _soak(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_benchmark("soak", *args, timeout=timeout, own_servers=True)


def test_the_command_prints_the_plan_of_its_seed() -> None:
    proc = _soak("--plan", "--minutes", "30", "--seed", "26", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[1:] == [f.line() for f in plan_faults(26, 30)]


def test_without_a_network_namespace_the_command_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "reminder_pipeline_testkit.netns.netns_unavailable", lambda: "needs root (test)"
    )
    assert soak.main(["--minutes", "3", "--seed", "26"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "network namespace" in err and "needs root (test)" in err


# --- the checker, on outcomes made up here (no servers) ------------------------------------------

T0 = 1_000_000.0
OWNER, CLIENT = "0000000a-0000-0000-0000-000000000000", "0000000b-0000-0000-0000-000000000000"


def _row(n: int, due: float, status: str = "Sent", event_status: str = "Active") -> Row:
    return Row(f"r{n}", f"e{n}", due, status, event_status, (OWNER,), 1)


def _fault(kind: str, start: float, end: float) -> FaultRecord:
    return FaultRecord(kind, start - T0, started=start, ended=end, injected=True)


def _check(rows, messages, notified, faults, events=None):
    return check(rows, Topic(messages=messages), notified, faults, events or {})


def test_a_fault_whose_window_held_no_reminder_is_reported_and_proves_nothing() -> None:
    rows = [_row(1, T0), _row(2, T0 + 100)]
    messages = {"r1": [(T0 + 1, b"p1")], "r2": [(T0 + 101, b"p2")]}
    notified = [(T0 + 2, "r1", OWNER), (T0 + 102, "r2", OWNER)]
    faults = [
        _fault("broker_pause", T0 + 30, T0 + 51),  # nothing due, nothing in flight
        _fault("broker_drop", T0 + 95, T0 + 105),  # r2 falls due inside
        _fault("worker_kill", T0 + 1.5, T0 + 1.5),  # r1 in flight (sent, not yet notified)
    ]
    report = _check(rows, messages, notified, faults)
    assert report["fault_windows"] == [
        {"due_in_window": 0, "in_flight": 0},
        {"due_in_window": 1, "in_flight": 0},
        {"due_in_window": 0, "in_flight": 1},
    ]
    assert report["faults_held_no_reminder"] == 1
    by_kind = report["by_kind"]
    assert (by_kind["broker_pause"]["held_no_reminder"], by_kind["broker_pause"]["checked"]) == (
        1,
        0,
    )
    assert by_kind["broker_drop"]["held_no_reminder"] == 0
    assert by_kind["broker_drop"]["checked"] == 1
    assert report["faults_by_kind"]["broker_pause"] == 1  # injected, reported, not proven


def test_after_a_failover_a_resend_is_not_a_double_but_a_second_notification_is() -> None:
    failover = _fault("failover", T0 + 50, T0 + 60)
    rows = [_row(1, T0), _row(2, T0), _row(3, T0)]
    messages = {
        "r1": [(T0 + 1, b"same"), (T0 + 70, b"same")],  # Sent commit lost, sent again
        "r2": [(T0 + 1, b"one"), (T0 + 70, b"another")],  # a different payload: doubled
        "r3": [(T0 + 1, b"p3"), (T0 + 70, b"p3")],
        "gone": [(T0 + 40, b"event lost")],  # its event's commit lost in the failover
    }
    notified = [
        (T0 + 2, "r1", OWNER),
        (T0 + 2, "r2", OWNER),
        (T0 + 2, "r3", OWNER),
        (T0 + 71, "r3", OWNER),  # the consumer did not absorb the copy
    ]
    report = _check(rows, messages, notified, [failover])
    assert report["lost"] == 0 and report["sent_after_cancel"] == 0
    assert set(report["examples"]["doubled"]) == {"r2", "r3"}
    assert report["resent_same_payload"] == 2
    assert report["unknown_to_new_primary"] == 1
    # Without the failover, a message for a reminder the database does not hold was sent after
    # its event went away.
    assert _check(rows, messages, notified, [])["sent_after_cancel"] == 1


def test_a_live_reminder_not_sent_is_lost_and_one_cancelled_before_due_sent_is_flagged() -> None:
    rows = [_row(1, T0, status="Pending"), _row(2, T0, event_status="Cancelled")]
    cancel = EventRecord(uuid.UUID(int=2), T0, 5, "cancel", created=True, cancelled_at=T0 - 10)
    events = {"e2": cancel}
    messages = {"r2": [(T0 + 1, b"p2")]}
    report = _check(rows, messages, [(T0 + 2, "r2", OWNER)], [], events)
    assert (report["lost"], report["sent_after_cancel"]) == (1, 1)


@pytest.mark.slow
@pytest.mark.server
def test_a_short_seeded_soak_loses_nothing_doubles_nothing_sends_nothing_cancelled() -> None:
    require_netns()
    proc = _soak("--minutes", str(SHORT_MINUTES), "--seed", str(SHORT_SEED), "--json", timeout=1500)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for key in ("faults", "checked", "lost", "doubled", "sent_after_cancel", "recovery_max_s"):
        assert key in report
    summary = {k: report[k] for k in ("lost", "doubled", "sent_after_cancel")}
    assert summary == {"lost": 0, "doubled": 0, "sent_after_cancel": 0}, json.dumps(
        {k: report[k] for k in ("examples", "fault_log", "by_kind")}
    )[:3000]
    assert report["checked"] > 0
    # Every kind was injected (a run worker may not be caught mid-drain), the failover once.
    injected = {k: n for k, n in report["faults_by_kind"].items() if n}
    assert set(injected) >= set(KINDS) - {"worker_kill"}, report["faults_not_injected"]
    assert injected["failover"] == injected["long_snapshot"] == 1
    assert all("held_no_reminder" in entry for entry in report["fault_log"])
    assert proc.returncode == 0


def test_a_row_materialised_skipped_is_owed_nothing_but_one_skipped_later_is_lost() -> None:
    # An event created (or moved) after its reminder's due time, the calendar's database
    # having been out of reach: the calendar's own rule skips the row; nothing is owed. A row
    # skipped later with its event live is the dispatcher's doing: lost.
    at_creation = Row("r1", "e1", T0, "Skipped", "Planned", (OWNER,), 0, skipped_at_creation=True)
    later = Row("r2", "e2", T0, "Skipped", "Planned", (OWNER,), 0)
    report = _check([at_creation, later], {}, [], [])
    assert report["skipped_at_creation"] == 1
    assert report["lost"] == 1 and set(report["examples"]["lost"]) == {"r2"}


def test_an_armed_kind_is_never_the_last_fault() -> None:
    # seed 4242's 30-minute plan once put worker_kill last: the workload ended before a burst's
    # drain came, and the kill was never injected.
    for seed in (*range(100), 4242):
        for minutes in (3, 30):
            assert plan_faults(seed, minutes)[-1].kind not in ARMED_KINDS, (seed, minutes)


def test_a_long_snapshot_holds_back_the_horizon_while_it_lasts_then_lets_go(
    database_url: str, engine: Engine
) -> None:
    # The fault alone, on a database of its own (the whole soak runs it among the others).
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    stack = SimpleNamespace(app_dsn=dsn)
    record = FaultRecord("long_snapshot", 0.0, started=time.time())
    fault = threading.Thread(target=Stack._long_snapshot, args=(stack, record, 3.0, 0.0))
    fault.start()

    def holders() -> list[str | None]:
        with engine.connect() as conn:
            return [h.application_name for h in snapshot_holders(conn)]

    deadline = time.time() + 2.5
    while "soak-long-snapshot" not in holders() and time.time() < deadline:
        time.sleep(0.1)
    assert "soak-long-snapshot" in holders()  # what the exporter's query sees
    fault.join(30)
    assert record.injected
    assert "REPEATABLE READ snapshot" in record.detail and "held 3.0 s" in record.detail
    assert "soak-long-snapshot" not in holders()
