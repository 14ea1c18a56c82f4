"""How the consumer runs (its options, the production defaults) and what a run did (its stats)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..domain import contract
from ..messaging.dead_letters import DLQ_TOPIC
from .dead_letter_copy import DEFAULT_DLQ_MAX_BYTES, DLQ_RECORD_OVERHEAD
from .texts import Locale, parse_locale

DEFAULT_GROUP_ID = "notifications-reference"


@dataclass
class ConsumeStats:
    """What a run did; ``messages`` counts messages handled and committed."""

    messages: int = 0
    reminders_notified: int = 0
    notifications: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    dead_letters_refused: int = 0
    passed_dropped: int = 0
    retries: int = 0
    warnings: int = 0
    time_zone_fallbacks: int = 0
    commit_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        """Flat dict for logs."""
        return asdict(self)


@dataclass(frozen=True)
class ConsumerOptions:
    """How the consumer runs; the defaults are the production ones."""

    group_id: str = DEFAULT_GROUP_ID
    topic: str = contract.TOPIC
    dlq_topic: str = DLQ_TOPIC
    #: Attempts at reading a message into notifications (unparseable, incompatible, or any
    #: error building them) before it goes to the dead-letter topic. Delivery is not bounded.
    max_attempts: int = 3
    retry_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    poll_timeout_seconds: float = 0.5
    #: The most messages one poll hands to the handling: each partition's share is one batch
    #: (one question to the de-dup store, one write, one offset commit). 2,000: in a backlog a
    #: poll brings ~1,400 of one partition; against 500 that is a third of the round trips, and
    #: the de-dup write costs less per row when more of a batch's rows share its index pages.
    batch_size: int = 2000
    dlq_timeout_seconds: float = 15.0
    #: The largest dead-letter copy produced (value, key and headers); a bigger one is cut.
    dlq_max_bytes: int = DEFAULT_DLQ_MAX_BYTES
    #: librdkafka properties of the dead-letter producer layered over the defaults.
    dlq_producer_config: Mapping[str, Any] = field(default_factory=dict)
    #: ``once``: stop when nothing has arrived for this long after joining. Not the high
    #: watermark: brokers (the embedded one among them) may under-report it.
    once_idle_seconds: float = 5.0
    #: librdkafka properties layered over the defaults (tests make group joins faster).
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    #: The language of the reminder texts (``en``, ``ru``).
    locale: str = Locale.EN.value
    #: A reminder whose StartAt passed more than this long ago is dropped, not notified (the
    #: contract allows it: a re-published or long-held message about a meeting that is over).
    #: The grace keeps "starts now" reminders (OffsetMinutes 0) that arrive seconds late.
    #: None: never drop.
    drop_after_start_seconds: float | None = 300.0

    def __post_init__(self) -> None:
        parse_locale(self.locale)  # a bad locale must stop the start, not dead-letter every message
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.dlq_max_bytes < 4 * DLQ_RECORD_OVERHEAD:
            raise ValueError(f"dlq_max_bytes must be at least {4 * DLQ_RECORD_OVERHEAD}")
        if self.drop_after_start_seconds is not None and self.drop_after_start_seconds < 0:
            raise ValueError("drop_after_start_seconds must be 0 or more (None: never drop)")
        if self.retry_backoff_seconds <= 0 or self.max_backoff_seconds < self.retry_backoff_seconds:
            raise ValueError("need 0 < retry_backoff_seconds <= max_backoff_seconds")

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` failures: doubling, capped."""
        return min(
            self.max_backoff_seconds,
            self.retry_backoff_seconds * 2.0 ** (failed_attempts - 1),
        )
