"""A server the consumer depends on went away: one line when it goes, one when it is back.

While the de-dup store or the broker does not answer, every message would fail the same way; the
consumer logs the outage once (not once per message), shows it on its metrics
(``dependency_up{dependency}`` 0, ``outages_total{dependency}`` + 1), and probes the server with
capped back-off so work resumes within seconds of the server answering again.
"""

from __future__ import annotations

import logging
import math

from ..logs import event
from .metrics import ConsumerMetrics

log = logging.getLogger(__name__)

#: The longest wait between two probes of a server that is down: work resumes at most this long
#: after it answers.
MAX_PROBE_SECONDS = 5.0


class Outage:
    """Whether one dependency is down now, since when, and when to probe it next."""

    def __init__(
        self,
        dependency: str,
        metrics: ConsumerMetrics,
        *,
        group_id: str,
        first_probe_seconds: float,
        max_probe_seconds: float = MAX_PROBE_SECONDS,
    ) -> None:
        self.dependency = dependency
        self.metrics = metrics
        self.group_id = group_id
        self.first_probe_seconds = min(first_probe_seconds, max_probe_seconds)
        self.max_probe_seconds = max_probe_seconds
        self.started_at: float | None = None
        self.failed_probes = 0
        self.next_probe_at = math.inf
        metrics.dependency_up.labels(dependency).set(1)

    @property
    def active(self) -> bool:
        """True between the first failure and the probe that finds the server back."""
        return self.started_at is not None

    def begin(self, error: str, now: float) -> None:
        """Note a failure caused by the server being away; logs and counts only the first."""
        if self.started_at is not None:
            return
        self.started_at = now
        self.failed_probes = 0
        self.next_probe_at = now + self.first_probe_seconds
        self.metrics.dependency_up.labels(self.dependency).set(0)
        self.metrics.outages.labels(self.dependency).inc()
        event(
            log,
            logging.ERROR,
            "dependency unavailable; its work is held until it answers",
            dependency=self.dependency,
            group_id=self.group_id,
            error=error,
        )

    def probe_due(self, now: float) -> bool:
        """True when an outage is open and its next probe is due."""
        return self.started_at is not None and now >= self.next_probe_at

    def seconds_to_probe(self, now: float) -> float | None:
        """Seconds until the next probe, or None without an outage."""
        return None if self.started_at is None else max(self.next_probe_at - now, 0.0)

    def probe_failed(self, now: float) -> None:
        """The server still does not answer: probe again after a longer wait (capped)."""
        self.failed_probes += 1
        wait = self.first_probe_seconds * 2**self.failed_probes
        self.next_probe_at = now + min(self.max_probe_seconds, wait)

    def end(self, now: float) -> None:
        """The server answers again: one line with how long it was away."""
        if self.started_at is None:
            return
        seconds = round(now - self.started_at, 3)
        self.started_at = None
        self.next_probe_at = math.inf
        self.metrics.dependency_up.labels(self.dependency).set(1)
        event(
            log,
            logging.WARNING,
            "dependency available again; held work resumes",
            dependency=self.dependency,
            group_id=self.group_id,
            outage_seconds=seconds,
            failed_probes=self.failed_probes,
        )
