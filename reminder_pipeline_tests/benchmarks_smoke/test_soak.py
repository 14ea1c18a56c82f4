"""The seeded fault soak (``python -m benchmarks.soak``): its plan is a pure function of the seed
and the minutes (``--plan --json``, no servers, seconds), its checker judges synthetic outcomes as
the docs say (``--check``: an empty fault window is not a proof; after a failover a re-send with the
same payload is not a double), it refuses in one line where packets cannot be dropped, and a short
seeded run against the real stack, every fault kind in it (packet drops in a network namespace of
its own, a stuck and a slow PostgreSQL through the fault proxy, a cut commit, a failover to a
replica that lost its last commits, a snapshot held open while the load runs), keeps the
invariants (nothing lost, nothing doubled, nothing sent after a cancel; no timing asserts)."""

from __future__ import annotations

import functools
import itertools
import json
import uuid
from pathlib import Path

import pytest

from reminder_pipeline_testkit.netns import require_netns

from .helpers import run_benchmark

#: The suite's short run: every kind once in 3 minutes (durations scaled to a tenth).
SHORT_SEED, SHORT_MINUTES = 26, 3
#: The fault kinds benchmarks/README.md lists, in the report's order.
KINDS = (
    "worker_kill",
    "daemon_kill",
    "postgres_restart_fast",
    "postgres_restart_immediate",
    "dedup_restart",
    "broker_pause",
    "consumer_kill",
    "postgres_drop",
    "postgres_stuck",
    "postgres_slow",
    "cut_commit",
    "failover",
    "broker_drop",
    "dedup_drop",
    "long_snapshot",
)
#: Once per run whatever its length; waiting for their moment (never the last fault).
ONCE_PER_RUN, ARMED = {"failover", "long_snapshot"}, {"worker_kill", "cut_commit"}
#: The floors (seconds) a short run's silent faults and broker pause never go below.
FLOORS = {"postgres_drop": 5, "broker_drop": 5, "dedup_drop": 5, "failover": 3, "broker_pause": 5}
#: The seeds whose plans the tests below read (seed 4242's 30-minute plan once put an armed
#: kind last).
SEEDS = "0-99,4242"


def _soak(*args: str, timeout: float, env: dict[str, str] | None = None):
    return run_benchmark("soak", *args, timeout=timeout, own_servers=True, env=env)


@functools.cache
def _plans(minutes: float) -> dict[int, dict]:
    """``--plan --json`` of every seed in SEEDS for a ``minutes`` run, by seed (one process)."""
    proc = _soak("--plan", "--json", "--minutes", f"{minutes:g}", "--seed", SEEDS, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plans = [json.loads(line) for line in proc.stdout.splitlines()]
    return {plan["seed"]: plan for plan in plans}


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    plan = _plans(30)[26]
    # Again in a process of its own, the minutes spelled 30.0: the same plan.
    again = _soak("--plan", "--json", "--minutes", "30.0", "--seed", "26", timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [json.loads(again.stdout)["faults"]] == [plan["faults"]]
    assert plan["faults"] != _plans(30)[27]["faults"]
    assert plan["faults"] != _plans(20)[26]["faults"]


@pytest.mark.parametrize("minutes", [2, 3, 10, 30, 45, 90])
def test_every_kind_is_planned_often_enough_one_after_another_inside_the_run(
    minutes: int,
) -> None:
    plan = _plans(minutes)[5]
    faults = plan["faults"]
    times = [f["at_s"] for f in faults]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < minutes * 60
    # Twice in the 30-minute run; the failover and the long snapshot once, whatever the length.
    counts = plan["per_kind"]
    assert tuple(counts) == KINDS
    assert counts == {k: sum(f["kind"] == k for f in faults) for k in KINDS}
    assert counts == {k: 1 if k in ONCE_PER_RUN else max(1, minutes // 15) for k in KINDS}
    # No planned fault starts before the one before it is over.
    for before, after in itertools.pairwise(faults):
        assert before["at_s"] + before["down_s"] <= after["at_s"], (before, after)
    assert plan["own_network"]


@pytest.mark.parametrize("seed", range(6))
def test_full_scale_durations_are_the_issues(seed: int) -> None:
    faults = _plans(30)[seed]["faults"]
    for kind in ("broker_pause", "postgres_drop", "broker_drop", "dedup_drop"):
        assert all(30 <= f["down_s"] <= 90 for f in faults if f["kind"] == kind), kind
    assert all(f["down_s"] == 60 for f in faults if f["kind"] == "postgres_slow")
    # A snapshot held for several minutes, as a report or a nightly pg_dump holds one.
    assert [180 <= f["down_s"] <= 360 for f in faults if f["kind"] == "long_snapshot"] == [True]
    short = _plans(3)[seed]
    assert short["scale"] == 0.1
    assert all(f["down_s"] >= FLOORS[f["kind"]] for f in short["faults"] if f["kind"] in FLOORS)


def test_a_cut_commit_takes_both_outcomes_in_turn() -> None:
    faults = _plans(30)[26]["faults"]
    cuts = [f["variant"] for f in faults if f["kind"] == "cut_commit"]
    assert sorted(cuts) == ["server_commits", "server_rolls_back"]
    assert all(f["variant"] == "" for f in faults if f["kind"] != "cut_commit")


def test_the_command_prints_the_plan_of_its_seed() -> None:
    proc = _soak("--plan", "--minutes", "30", "--seed", "26", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    plan = _plans(30)[26]
    assert lines[0].startswith(f"fault plan: seed 26, 30 min, {len(plan['faults'])} faults (")
    assert lines[1:] == [f["line"] for f in plan["faults"]]


def test_without_a_network_namespace_the_command_refuses_in_one_line(tmp_path: Path) -> None:
    # No unshare, ip or iptables on PATH (and, as any user but root, no right to use them).
    proc = _soak("--minutes", "3", "--seed", "26", timeout=60, env={"PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "network namespace" in proc.stderr
    assert "needs " in proc.stderr and not proc.stdout
    # A run takes one seed; several are for --plan.
    proc = _soak("--minutes", "3", "--seed", "26,27", timeout=60)
    assert proc.returncode == 2 and "one seed" in proc.stderr


# --- the checker, on outcomes made up here (no servers) ------------------------------------------

T0 = 1_000_000.0
OWNER, CLIENT = "0000000a-0000-0000-0000-000000000000", "0000000b-0000-0000-0000-000000000000"


def _row(n: int, due: float, status: str = "Sent", event_status: str = "Active", **more) -> dict:
    return {
        "reminder_id": f"r{n}",
        "event_id": f"e{n}",
        "due": due,
        "status": status,
        "event_status": event_status,
        "recipients": [OWNER],
        "outbox_rows": 1,
        **more,
    }


def _fault(kind: str, start: float, end: float) -> dict:
    return {"kind": kind, "planned_s": start - T0, "started": start, "ended": end, "injected": True}


def _check(tmp_path: Path, rows, messages, notified, faults, events=None) -> dict:
    """``--check --json`` of these outcomes (as ``outcomes.json`` holds a run's); its exit code
    says whether an invariant failed."""
    outcomes = tmp_path / f"outcomes-{uuid.uuid4().hex[:8]}.json"
    topic = {"messages": messages, "unreadable": 0}
    outcomes.write_text(
        json.dumps(
            {
                "rows": rows,
                "topic": topic,
                "notified": notified,
                "faults": faults,
                "events": events or {},
            }
        )
    )
    proc = _soak("--check", str(outcomes), "--json", timeout=60)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    failed = report["lost"] or report["doubled"] or report["sent_after_cancel"]
    assert proc.returncode == (1 if failed else 0), proc.stderr[-2000:]
    return report


def test_a_fault_whose_window_held_no_reminder_is_reported_and_proves_nothing(
    tmp_path: Path,
) -> None:
    rows = [_row(1, T0), _row(2, T0 + 100)]
    messages = {"r1": [(T0 + 1, "p1")], "r2": [(T0 + 101, "p2")]}
    notified = [(T0 + 2, "r1", OWNER), (T0 + 102, "r2", OWNER)]
    faults = [
        _fault("broker_pause", T0 + 30, T0 + 51),  # nothing due, nothing in flight
        _fault("broker_drop", T0 + 95, T0 + 105),  # r2 falls due inside
        _fault("worker_kill", T0 + 1.5, T0 + 1.5),  # r1 in flight (sent, not yet notified)
    ]
    report = _check(tmp_path, rows, messages, notified, faults)
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


def test_after_a_failover_a_resend_is_not_a_double_but_a_second_notification_is(
    tmp_path: Path,
) -> None:
    failover = _fault("failover", T0 + 50, T0 + 60)
    rows = [_row(1, T0), _row(2, T0), _row(3, T0)]
    messages = {
        "r1": [(T0 + 1, "same"), (T0 + 70, "same")],  # Sent commit lost, sent again
        "r2": [(T0 + 1, "one"), (T0 + 70, "another")],  # a different payload: doubled
        "r3": [(T0 + 1, "p3"), (T0 + 70, "p3")],
        "gone": [(T0 + 40, "event lost")],  # its event's commit lost in the failover
    }
    notified = [
        (T0 + 2, "r1", OWNER),
        (T0 + 2, "r2", OWNER),
        (T0 + 2, "r3", OWNER),
        (T0 + 71, "r3", OWNER),  # the consumer did not absorb the copy
    ]
    report = _check(tmp_path, rows, messages, notified, [failover])
    assert report["lost"] == 0 and report["sent_after_cancel"] == 0
    assert set(report["examples"]["doubled"]) == {"r2", "r3"}
    assert report["resent_same_payload"] == 2
    assert report["unknown_to_new_primary"] == 1
    # Without the failover, a message for a reminder the database does not hold was sent after
    # its event went away.
    assert _check(tmp_path, rows, messages, notified, [])["sent_after_cancel"] == 1


def test_a_live_reminder_not_sent_is_lost_and_one_cancelled_before_due_sent_is_flagged(
    tmp_path: Path,
) -> None:
    rows = [_row(1, T0, status="Pending"), _row(2, T0, event_status="Cancelled")]
    cancel = {
        "event_id": str(uuid.UUID(int=2)),
        "due": T0,
        "offset": 5,
        "fate": "cancel",
        "created": True,
        "cancelled_at": T0 - 10,
    }
    messages = {"r2": [(T0 + 1, "p2")]}
    report = _check(tmp_path, rows, messages, [(T0 + 2, "r2", OWNER)], [], {"e2": cancel})
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
    # The long snapshot was taken and held while the load ran (its own check:
    # faults/test_held_snapshot.py).
    [held] = [entry for entry in report["fault_log"] if entry["kind"] == "long_snapshot"]
    assert held["injected"] and "REPEATABLE READ snapshot" in held["detail"], held
    assert " held " in held["detail"] and "reminders sent meanwhile" in held["detail"], held
    assert proc.returncode == 0


def test_a_row_materialised_skipped_is_owed_nothing_but_one_skipped_later_is_lost(
    tmp_path: Path,
) -> None:
    # An event created (or moved) after its reminder's due time, the calendar's database
    # having been out of reach: the calendar's own rule skips the row; nothing is owed. A row
    # skipped later with its event live is the dispatcher's doing: lost.
    at_creation = _row(1, T0, "Skipped", "Planned", outbox_rows=0, skipped_at_creation=True)
    later = _row(2, T0, "Skipped", "Planned", outbox_rows=0)
    report = _check(tmp_path, [at_creation, later], {}, [], [])
    assert report["skipped_at_creation"] == 1
    assert report["lost"] == 1 and set(report["examples"]["lost"]) == {"r2"}


def test_an_armed_kind_is_never_the_last_fault() -> None:
    # seed 4242's 30-minute plan once put worker_kill last: the workload ended before a burst's
    # drain came, and the kill was never injected.
    for minutes in (3, 30):
        for seed, plan in _plans(minutes).items():
            assert plan["faults"][-1]["kind"] not in ARMED, (seed, minutes)
        assert len(_plans(minutes)) == 101
