"""The soak's fault plan: a pure function of ``seed`` and ``minutes`` (no clock, no servers).

Every kind is injected ``max(1, minutes // 15)`` times (twice in a 30-minute run), except the
failover and the long snapshot, once per run whatever its length; in a seeded order. Durations are the 30-minute run's,
scaled by ``minutes / 30`` for shorter runs (never below a floor that still makes the fault a
fault). The faults are laid out one after another over the faulted span: each gets its own
duration plus an equal share of the time left over, and starts early in that share, so no two
planned faults overlap and the stack has the rest of the share to come back.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

#: The fault kinds, in the order the report lists them.
KINDS = (
    "worker_kill",  # SIGKILL of the dispatch run's worker process while it drains
    "daemon_kill",  # SIGKILL of dagster-daemon (its process group), restarted after down_s
    "postgres_restart_fast",  # the application's PostgreSQL: pg_ctl stop -m fast, start
    "postgres_restart_immediate",  # the same with -m immediate (crash recovery on start)
    "dedup_restart",  # the consumer's de-dup PostgreSQL (a server of its own), stop -m fast, start
    "broker_pause",  # SIGSTOP of the broker, SIGCONT after down_s (30-90 s at full scale)
    "consumer_kill",  # SIGKILL of the reference consumer, restarted after down_s
    "postgres_drop",  # the application's PostgreSQL: every packet to and from it dropped (iptables)
    "postgres_stuck",  # the application's PostgreSQL a stuck peer: sockets kept open, nothing sent
    "postgres_slow",  # ~200 ms added to every round trip to the application's PostgreSQL
    "cut_commit",  # a dispatch run's COMMIT cut before its answer; the server commits or not
    "failover",  # the primary killed with commits its replica never got; the replica promoted
    "broker_drop",  # every packet to and from the broker dropped
    "dedup_drop",  # every packet to and from the de-dup store's PostgreSQL dropped
    "long_snapshot",  # a REPEATABLE READ snapshot held open on the application's database
)

#: Injected once per run, whatever its length: a run has one replica to promote, and a snapshot
#: held for several minutes takes a share of the run that a second one would take from the others.
ONCE_PER_RUN = frozenset({"failover", "long_snapshot"})

#: Kinds that drop packets (the failover silences the old primary's address so): the stack needs
#: a network namespace of its own (root, iptables).
PACKET_DROP_KINDS = frozenset({"postgres_drop", "broker_drop", "dedup_drop", "failover"})

#: Kinds that wait for their moment (a run worker mid-drain, a COMMIT to cut): armed at their
#: planned time, they wait in the background while the plan goes on.
ARMED_KINDS = frozenset({"worker_kill", "cut_commit"})

#: Kinds drawn with a variant: the cut commit that the server commits, or rolls back.
VARIANTS = {"cut_commit": ("server_commits", "server_rolls_back")}

#: Seconds down at full scale (a 30-minute run): (low, high) of a uniform draw, and the floor.
#: For postgres_stuck: how long the proxy holds every socket (a connection held stays silent
#: until its client gives up on it, whatever comes after); for the failover: how long the old
#: primary's address is silent before the switch (a DNS or virtual-IP move).
DOWN_SECONDS = {
    "worker_kill": (0.0, 0.0, 0.0),
    "daemon_kill": (5.0, 30.0, 2.0),
    "postgres_restart_fast": (2.0, 10.0, 1.0),
    "postgres_restart_immediate": (2.0, 10.0, 1.0),
    "dedup_restart": (2.0, 10.0, 1.0),
    "broker_pause": (30.0, 90.0, 5.0),
    "consumer_kill": (5.0, 30.0, 2.0),
    "postgres_drop": (30.0, 90.0, 5.0),
    "postgres_stuck": (30.0, 60.0, 5.0),
    "postgres_slow": (60.0, 60.0, 6.0),
    "cut_commit": (0.0, 0.0, 0.0),
    "failover": (10.0, 40.0, 3.0),
    "broker_drop": (30.0, 90.0, 5.0),
    "dedup_drop": (30.0, 90.0, 5.0),
    # How long the snapshot is held: several minutes, as a report or a nightly pg_dump holds one.
    "long_snapshot": (180.0, 360.0, 10.0),
}

#: The first fault comes this long after the workload starts (a normal tick or two first); the
#: last share ends this long before the workload stops.
LEAD_IN_SECONDS = 20.0
TAIL_SECONDS = 10.0
#: The planned faults take at most this share of the faulted span (the rest is for recovery):
#: longer draws are shortened in proportion (only short runs, where the floors weigh).
MAX_DOWN_SHARE = 0.75


@dataclass(frozen=True)
class Fault:
    """One planned fault: when (seconds after the workload starts), what, and for how long."""

    at_s: float
    kind: str
    down_s: float
    variant: str = ""

    def line(self) -> str:
        variant = f" {self.variant}" if self.variant else ""
        down = f" (down {self.down_s:.1f} s)" if self.down_s else ""
        return f"+{self.at_s:7.1f} s  {self.kind}{variant}{down}"


def scale(minutes: float) -> float:
    """How much of the full-scale durations a run of ``minutes`` uses (0.1 .. 1)."""
    return min(1.0, max(0.1, minutes / 30.0))


def faults_per_kind(minutes: float, kind: str = "") -> int:
    """How often ``kind`` is injected in a run of ``minutes``."""
    return 1 if kind in ONCE_PER_RUN else max(1, int(minutes // 15))


def plan_faults(seed: int, minutes: float) -> tuple[Fault, ...]:
    """The faults of a ``minutes`` run with ``seed``: the same arguments, the same plan."""
    if minutes <= 0:
        raise ValueError("minutes must be more than 0")
    rng = random.Random(f"soak:{seed}:{float(minutes)!r}")  # 30 and 30.0: one plan
    kinds = [k for k in KINDS for _ in range(faults_per_kind(minutes, k))]
    rng.shuffle(kinds)
    # An armed kind waits for its moment (a burst's drain comes every other minute): never in
    # the last share, where the workload can end before that moment comes.
    if kinds[-1] in ARMED_KINDS and any(k not in ARMED_KINDS for k in kinds):
        j = max(i for i, k in enumerate(kinds) if k not in ARMED_KINDS)
        kinds[j], kinds[-1] = kinds[-1], kinds[j]
    factor = scale(minutes)
    downs = []
    for kind in kinds:
        low, high, floor = DOWN_SECONDS[kind]
        downs.append(0.0 if high == 0 else max(floor, rng.uniform(low, high) * factor))
    span_start = LEAD_IN_SECONDS
    span = max(float(len(kinds)), minutes * 60.0 - TAIL_SECONDS - span_start)
    if sum(downs) > MAX_DOWN_SHARE * span:
        shrink = MAX_DOWN_SHARE * span / sum(downs)
        downs = [d * shrink for d in downs]
    share = (span - sum(downs)) / len(kinds)  # recovery time after each fault
    # A kind with variants takes them in turn from a seeded first one (both in a 30-minute run).
    turn = {kind: rng.randrange(len(variants)) for kind, variants in VARIANTS.items()}
    faults = []
    at = span_start
    for kind, down in zip(kinds, downs, strict=True):
        # Early in its share: the fault and its recovery fit before the next one.
        start = at + rng.uniform(0.0, 0.25 * share)
        variant = ""
        if kind in VARIANTS:
            variant = VARIANTS[kind][turn[kind] % len(VARIANTS[kind])]
            turn[kind] += 1
        faults.append(Fault(round(start, 1), kind, round(down, 1), variant))
        at += down + share
    return tuple(faults)


def needs_own_network(plan: tuple[Fault, ...]) -> bool:
    """Whether ``plan`` drops packets (the stack must run in a network namespace of its own)."""
    return any(f.kind in PACKET_DROP_KINDS for f in plan)


def plan_lines(seed: int, minutes: float) -> list[str]:
    faults = plan_faults(seed, minutes)
    counts = per_kind(faults)
    head = (
        f"fault plan: seed {seed}, {minutes:g} min, {len(faults)} faults "
        f"({', '.join(f'{k} x{n}' for k, n in counts.items())}), durations x{scale(minutes):.2f}"
    )
    return [head, *(f.line() for f in faults)]


def per_kind(faults: tuple[Fault, ...]) -> dict[str, int]:
    """How many faults of each kind (every kind, in the report's order)."""
    return {k: sum(1 for f in faults if f.kind == k) for k in KINDS}


def plan_record(seed: int, minutes: float) -> dict:
    """The plan as ``--plan --json`` prints it: the faults (each with its printed line), how many
    of each kind, the scale of the durations, and whether it needs a network namespace."""
    faults = plan_faults(seed, minutes)
    return {
        "seed": seed,
        "minutes": minutes,
        "scale": scale(minutes),
        "per_kind": per_kind(faults),
        "own_network": needs_own_network(faults),
        "faults": [{**asdict(f), "line": f.line()} for f in faults],
    }
