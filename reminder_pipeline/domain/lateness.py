"""A cycle's lateness (SentAt - DueAt) as a fixed-size summary, never one number per row.

The summary is what the metrics ledger keeps per cycle and what the lateness SLO reads: the
count, the sum, the largest, and per-bucket counts over :data:`LATENESS_BUCKETS`. It has the
same size for a batch of 1 row and a drain of 140,000, so a Dagster step that hands a cycle's
counts to the next stores a few hundred bytes, not a float per sent row (docs/design.md, "Peaks").
The counts, the bucket counts and the largest value are exact; the p95 the SLO check reads is
interpolated within a bucket, as Prometheus' ``histogram_quantile`` does over the same buckets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Upper bounds (seconds) of the lateness histogram: dense around the design's 120 s SLO.
LATENESS_BUCKETS: tuple[float, ...] = (1, 5, 10, 30, 60, 66, 75, 90, 120, 180, 300, 600)


def bucket_counts(values: Iterable[float], bounds: Sequence[float]) -> list[int]:
    """Per-bucket (non-cumulative) counts of ``values``; the last element is the +Inf bucket."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        # Prometheus buckets are "less than or equal": a value on a bound belongs to that bucket.
        counts[bisect.bisect_left(bounds, value)] += 1
    return counts


def _empty() -> list[int]:
    return [0] * (len(LATENESS_BUCKETS) + 1)


@dataclass
class Lateness:
    """SentAt - DueAt of the rows sent, summarised: count, sum, largest, per-bucket counts."""

    count: int = 0
    total: float = 0.0
    largest: float | None = None
    #: Per-bucket counts over :data:`LATENESS_BUCKETS`; the last one is the +Inf bucket.
    buckets: list[int] = field(default_factory=_empty)

    def observe(self, seconds: float | None) -> None:
        """Count one sent row's lateness (a missing or non-finite value is not a measurement)."""
        if seconds is None or not math.isfinite(seconds):
            return
        self.count += 1
        self.total += seconds
        self.largest = seconds if self.largest is None else max(self.largest, seconds)
        self.buckets[bisect.bisect_left(LATENESS_BUCKETS, seconds)] += 1

    def add(self, other: Lateness) -> None:
        """Merge another summary into this one (another batch of the same cycle)."""
        self.count += other.count
        self.total += other.total
        if other.largest is not None:
            self.largest = (
                other.largest if self.largest is None else max(self.largest, other.largest)
            )
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Lateness:
        """The summary of these lateness values."""
        summary = cls()
        for value in values:
            summary.observe(value)
        return summary

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Lateness:
        """From ``dataclasses.asdict`` of one (a step's stored output)."""
        buckets = [int(n) for n in data.get("buckets") or []]
        if len(buckets) != len(LATENESS_BUCKETS) + 1:
            raise ValueError(f"lateness buckets: {len(buckets)} counts, not a known histogram")
        largest = data.get("largest")
        return cls(
            count=int(data.get("count", 0)),
            total=float(data.get("total", 0.0)),
            largest=None if largest is None else float(largest),
            buckets=buckets,
        )
