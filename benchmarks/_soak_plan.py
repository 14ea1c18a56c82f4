"""The soak's fault plan: a pure function of ``seed`` and ``minutes`` (no clock, no servers).

Every kind is injected ``max(1, minutes // 15)`` times (twice in a 30-minute run), in a seeded
order, one per equal slot of the faulted span, early in its slot so the stack has the rest of
the slot to come back. Durations are the 30-minute run's, scaled by ``minutes / 30`` for shorter
runs (never below a floor that still makes the fault a fault).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The fault kinds, in the order the report lists them.
KINDS = (
    "worker_kill",  # SIGKILL of the dispatch run's worker process while it drains
    "daemon_kill",  # SIGKILL of dagster-daemon (its process group), restarted after down_s
    "postgres_restart_fast",  # the application's PostgreSQL: pg_ctl stop -m fast, start
    "postgres_restart_immediate",  # the same with -m immediate (crash recovery on start)
    "dedup_restart",  # the consumer's de-dup PostgreSQL (a server of its own), stop -m fast, start
    "broker_pause",  # SIGSTOP of the broker, SIGCONT after down_s (30-90 s at full scale)
    "consumer_kill",  # SIGKILL of the reference consumer, restarted after down_s
)

#: Seconds down at full scale (a 30-minute run): (low, high) of a uniform draw, and the floor.
DOWN_SECONDS = {
    "worker_kill": (0.0, 0.0, 0.0),
    "daemon_kill": (5.0, 30.0, 2.0),
    "postgres_restart_fast": (2.0, 10.0, 1.0),
    "postgres_restart_immediate": (2.0, 10.0, 1.0),
    "dedup_restart": (2.0, 10.0, 1.0),
    "broker_pause": (30.0, 90.0, 5.0),
    "consumer_kill": (5.0, 30.0, 2.0),
}

#: The first fault comes this long after the workload starts (a normal tick or two first); the
#: last slot ends this long before the workload stops.
LEAD_IN_SECONDS = 20.0
TAIL_SECONDS = 10.0


@dataclass(frozen=True)
class Fault:
    """One planned fault: when (seconds after the workload starts), what, and for how long."""

    at_s: float
    kind: str
    down_s: float

    def line(self) -> str:
        down = f" (down {self.down_s:.1f} s)" if self.down_s else ""
        return f"+{self.at_s:7.1f} s  {self.kind}{down}"


def scale(minutes: float) -> float:
    """How much of the full-scale durations a run of ``minutes`` uses (0.1 .. 1)."""
    return min(1.0, max(0.1, minutes / 30.0))


def faults_per_kind(minutes: float) -> int:
    return max(1, int(minutes // 15))


def plan_faults(seed: int, minutes: float) -> tuple[Fault, ...]:
    """The faults of a ``minutes`` run with ``seed``: the same arguments, the same plan."""
    if minutes <= 0:
        raise ValueError("minutes must be more than 0")
    rng = random.Random(f"soak:{seed}:{float(minutes)!r}")  # 30 and 30.0: one plan
    kinds = [k for k in KINDS for _ in range(faults_per_kind(minutes))]
    rng.shuffle(kinds)
    span_start = LEAD_IN_SECONDS
    span_end = max(span_start + len(kinds), minutes * 60.0 - TAIL_SECONDS)
    slot = (span_end - span_start) / len(kinds)
    factor = scale(minutes)
    faults = []
    for i, kind in enumerate(kinds):
        low, high, floor = DOWN_SECONDS[kind]
        down = 0.0 if high == 0 else max(floor, rng.uniform(low, high) * factor)
        # Early in the slot: the fault and its recovery fit before the next one.
        at = span_start + i * slot + rng.uniform(0.0, 0.25 * slot)
        faults.append(Fault(round(at, 1), kind, round(down, 1)))
    return tuple(faults)


def plan_lines(seed: int, minutes: float) -> list[str]:
    faults = plan_faults(seed, minutes)
    counts = {k: sum(1 for f in faults if f.kind == k) for k in KINDS}
    head = (
        f"fault plan: seed {seed}, {minutes:g} min, {len(faults)} faults "
        f"({', '.join(f'{k} x{n}' for k, n in counts.items())}), durations x{scale(minutes):.2f}"
    )
    return [head, *(f.line() for f in faults)]
