"""Re-publish a DueAt day's published messages from the outbox, for a consumer that lost them.

The back-fill's plain use case (the Dagster job ``reminder_republish`` wraps it, one run per day).
What it sends are the stored messages: topic, key (= EventId), payload text and headers exactly as
the outbox holds them, plus one header, ``republished-by-run`` (the run that re-published it), so a
consumer's logs and traces tell a re-publish from the original. Consumers de-duplicate by
ReminderId, so a reminder they did receive is not delivered twice.

Rules:

* Only days whose rows are all still in the outbox: a day that starts before ``now - retention`` is
  refused (``outbox_retention`` deletes rows published before that, so the day could only be
  re-published in part), and so is a day in the future. A message is published at or after its
  DueAt, so no row of a later day can have been purged.
* Only a day whose rows are all there: a day with fewer outbox rows than Sent reminders lost
  rows to the purge (whatever ``retention`` says) and is refused, nothing sent, naming the count.
* Only what still holds: a message goes out again only if its reminder is still Sent and its
  event still Planned/InProgress with the StartAt the message carries; the others are counted by
  reason (``cancelled``, ``moved``, ``completed``, ``reminder_not_sent``) and logged with their ids.
  A consumer that lost its data must not notify people about cancelled or moved meetings.
* Only published rows, read, never written: unpublished rows are the relay's, and the back-fill
  changes no row's published state.
* Outbox id order, chunk after chunk: each key's messages go out in the order the relay sent them.
  Each chunk is produced under the relay's advisory lock (one publisher per database), so
  re-published messages never interleave with a live relay's batch; the lock is released between
  chunks, so a live relay waiting for it gets it before the next chunk.
* Each delivered copy is recorded (``outbox_republishes``: the reminder, the run, the partition
  and offset it landed at), so ``reminder-pipeline trace`` lists every re-publish of a reminder.
* A failed delivery stops the day with :class:`RepublishFailed`, naming how many were
  re-published; running the day again is safe.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from typing import NoReturn

from sqlalchemy.engine import Engine

from ..config import MAX_BATCH_SIZE
from ..domain.model import ClaimedMessage
from ..logs import Journal, event
from ..messaging.relay import Publisher
from ..messaging.relay_lock import relay_lock
from ..store import operator_repository, outbox_repository
from .outbox_retention import OUTBOX_RETENTION

log = logging.getLogger(__name__)

#: The header added to every re-published message: the id of the run that re-published it.
HEADER_REPUBLISHED_BY_RUN = "republished-by-run"

#: Why a published message is not re-published (store/outbox_queries.py, SELECT_PUBLISHED_OF_DAY).
STALE_REASONS = ("cancelled", "moved", "completed", "reminder_not_sent")

DEFAULT_CHUNK_SIZE = 500
#: A chunk is one statement's batch of outbox rows: at most the widest batch anything takes.
MAX_CHUNK_SIZE = MAX_BATCH_SIZE
#: A catch-up drain holds the relay lock for its whole run (up to 240 s): wait that out.
DEFAULT_LOCK_WAIT_SECONDS = 300.0
#: The longest a chunk may be told to wait for the relay lock: 20 minutes, inside the job's
#: 30-minute run limit (defs/republish.py, REPUBLISH_MAX_RUNTIME_SECONDS).
MAX_LOCK_WAIT_SECONDS = 20 * 60.0


class RepublishRefused(ValueError):
    """The day cannot be re-published (past the retention, purged in part, in the future)."""


class RepublishFailed(RuntimeError):
    """A delivery failed or the relay lock stayed busy; ``republished`` messages went out before."""

    def __init__(self, message: str, republished: int) -> None:
        super().__init__(message)
        self.republished = republished


@dataclass(frozen=True)
class Requester:
    """Who asked: the run, the back-fill it belongs to and the user, when Dagster knows them."""

    run_id: str
    backfill_id: str | None = None
    user: str | None = None

    def log_fields(self) -> dict[str, str]:
        """The identifiers for a log line (absent ones left out)."""
        fields = {"run_id": self.run_id, "backfill_id": self.backfill_id, "user": self.user}
        return {k: v for k, v in fields.items() if v}


@dataclass(frozen=True)
class RepublishReport:
    """What re-publishing one day did."""

    day: date
    republished: int
    unpublished: int
    chunks: int
    first_outbox_id: int | None
    last_outbox_id: int | None
    duration_ms: int
    #: Messages not re-published because they no longer hold, by reason.
    not_republished: dict[str, int] = field(default_factory=dict)


def day_window(day: date) -> tuple[datetime, datetime]:
    """The UTC interval ``[start, end)`` of a DueAt day."""
    start = datetime.combine(day, clock_time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def oldest_day(retention: timedelta, now: datetime) -> date:
    """The first day whose rows are all still inside the outbox retention at ``now``."""
    cutoff = now - retention
    start, _ = day_window(cutoff.date())
    return cutoff.date() if start >= cutoff else cutoff.date() + timedelta(days=1)


def check_day(
    day: date, retention: timedelta = OUTBOX_RETENTION, now: datetime | None = None
) -> None:
    """Refuse a day in the future or past the outbox retention, with one line naming both."""
    now = now or datetime.now(UTC)
    start, _ = day_window(day)
    if start > now:
        raise RepublishRefused(
            f"re-publish of {day} refused: the day is in the future "
            f"(now {now:%Y-%m-%d %H:%M} UTC); nothing has been published for it yet"
        )
    if day < oldest_day(retention, now):
        hours = retention.total_seconds() / 3600
        raise RepublishRefused(
            f"re-publish of {day} refused: the day is past the outbox retention ({hours:g} h); "
            f"rows published before {now - retention:%Y-%m-%d %H:%M} UTC may already be purged, "
            f"so it cannot be re-published whole (oldest day now: {oldest_day(retention, now)})"
        )


def republishable_days(
    engine: Engine, retention: timedelta = OUTBOX_RETENTION, now: datetime | None = None
) -> list[date]:
    """The days a re-publish would accept and send, oldest first: inside the retention, with
    published messages, and every Sent reminder's outbox row still there (none purged)."""
    now = now or datetime.now(UTC)
    days = []
    day = oldest_day(retention, now)
    with engine.connect() as conn:
        while day <= now.date():
            start, end = day_window(day)
            sent = outbox_repository.sent_of_day(conn, start, end)
            bounds = outbox_repository.republish_day_bounds(conn, start, end)
            if bounds.published > 0 and bounds.published + bounds.unpublished >= sent:
                days.append(day)
            day += timedelta(days=1)
    return days


def admit_day(
    day: date,
    requester: Requester,
    retention: timedelta = OUTBOX_RETENTION,
    now: datetime | None = None,
    journal: Journal | None = None,
) -> None:
    """:func:`check_day`, logging a refusal with who asked (before any read or publish)."""
    try:
        check_day(day, retention, now)
    except RepublishRefused as refused:
        (journal or Journal(log)).event(
            logging.WARNING,
            "republish refused",
            **requester.log_fields(),
            day=day.isoformat(),
            retention_hours=retention.total_seconds() / 3600,
            reason=str(refused),
        )
        raise


def _marked(message: ClaimedMessage, run_id: str) -> ClaimedMessage:
    """The stored message with the re-publish header added (the row itself is not changed)."""
    headers = {**message.headers, HEADER_REPUBLISHED_BY_RUN: run_id}
    return ClaimedMessage(message.id, message.topic, message.message_key, message.payload, headers)


def resend_day(
    engine: Engine,
    publisher: Publisher,
    day: date,
    requester: Requester,
    *,
    retention: timedelta = OUTBOX_RETENTION,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
    now: datetime | None = None,
    journal: Journal | None = None,
) -> RepublishReport:
    """Re-publish the published outbox messages due on ``day`` (UTC), in outbox id order.

    The day's id range is read once at the start: for today, that is the messages published
    before the run began. Each chunk waits for its delivery reports within the producer's own
    delivery timeout. Who-what-when goes to ``journal`` (the JSON log; a Dagster step passes one
    that also writes the run's event log). Raises :class:`RepublishRefused` before any read or
    publish for a day out of range, :class:`RepublishFailed` when a delivery fails or the relay
    lock stays busy for ``lock_wait_seconds``.
    """
    journal = journal or Journal(log)
    who = requester.log_fields()
    hours = retention.total_seconds() / 3600
    admit_day(day, requester, retention, now, journal)
    started = time.monotonic()
    start, end = day_window(day)
    with engine.connect() as conn:
        # Sent reminders first, outbox rows after: a cycle committing in between adds a Sent row
        # and its outbox row together, so only a purge can make the rows fewer.
        sent = outbox_repository.sent_of_day(conn, start, end)
        bounds = outbox_repository.republish_day_bounds(conn, start, end)
    rows = bounds.published + bounds.unpublished
    if rows < sent:
        refused = RepublishRefused(
            f"re-publish of {day} refused: {rows} outbox rows for {sent} Sent reminders due that "
            f"day ({sent - rows} purged), so it cannot be re-published whole; nothing was sent"
        )
        journal.event(
            logging.WARNING,
            "republish refused",
            **who,
            day=day.isoformat(),
            outbox_rows=rows,
            sent_reminders=sent,
            reason=str(refused),
        )
        raise refused
    journal.event(
        logging.INFO,
        "republish started",
        **who,
        day=day.isoformat(),
        retention_hours=hours,
        published_rows=bounds.published,
        unpublished_rows=bounds.unpublished,
        first_outbox_id=bounds.first_id,
        last_outbox_id=bounds.last_id,
    )
    republished = chunks = 0
    stale: dict[str, int] = {}
    last_sent: int | None = None
    after = (bounds.first_id or 0) - 1
    while bounds.last_id is not None:
        with engine.connect() as conn:
            chunk = outbox_repository.published_of_day(
                conn, start, end, after_id=after, last_id=bounds.last_id, limit=chunk_size
            )
        if not chunk:
            break
        after = chunk[-1].message.id
        dropped = [row for row in chunk if row.stale is not None]
        for row in dropped:
            stale[row.stale or ""] = stale.get(row.stale or "", 0) + 1
        if dropped:
            journal.batch(
                logging.INFO,
                "republish left out",
                [
                    {
                        "msg": "republish left out",
                        "reason": row.stale,
                        "reminder_id": row.reminder_id,
                        "event_id": row.event_id,
                        "outbox_id": row.message.id,
                    }
                    for row in dropped
                ],
                **who,
                day=day.isoformat(),
            )
        messages = [_marked(r.message, requester.run_id) for r in chunk if r.stale is None]
        if not messages:
            continue
        with relay_lock(engine, lock_wait_seconds, requester.run_id) as lock:
            if lock is None:
                _fail(
                    f"re-publish of {day} stopped: the relay lock stayed busy for "
                    f"{lock_wait_seconds:g} s; {republished} of the day's {bounds.published} "
                    "messages were re-published; launch the day again",
                    republished,
                    who,
                    day,
                    journal,
                )
            results = publisher.publish(messages)
        landed = [(r.outbox_id, r.partition, r.offset) for r in results if r.error is None]
        with engine.begin() as conn:  # every re-publish of a reminder, for its trace
            operator_repository.record_republishes(conn, requester.run_id, landed)
        delivered = len(landed)
        republished += delivered
        chunks += 1
        if delivered < len(messages):
            error = next((r.error for r in results if r.error is not None), "no delivery report")
            _fail(
                f"re-publish of {day} failed: {len(messages) - delivered} messages not delivered "
                f"({error}); {republished} of the day's {bounds.published} messages were "
                "re-published; launch the day again (consumers de-duplicate by ReminderId)",
                republished,
                who,
                day,
                journal,
            )
        last_sent = messages[-1].id
        event(
            log,
            logging.DEBUG,
            "republish chunk",
            **who,
            day=day.isoformat(),
            republished=delivered,
            first_outbox_id=messages[0].id,
            last_outbox_id=last_sent,
        )
    report = RepublishReport(
        day,
        republished,
        bounds.unpublished,
        chunks,
        bounds.first_id,
        last_sent,
        int((time.monotonic() - started) * 1000),
        stale,
    )
    journal.event(
        logging.INFO,
        "republish completed",
        **who,
        day=day.isoformat(),
        republished=republished,
        not_republished=sum(stale.values()),
        **{f"not_republished_{reason}": n for reason, n in sorted(stale.items())},
        unpublished_rows=bounds.unpublished,
        chunks=chunks,
        duration_ms=report.duration_ms,
    )
    return report


def _fail(
    message: str, republished: int, who: dict[str, str], day: date, journal: Journal
) -> NoReturn:
    """Log the failure with the requester's ids, then raise it."""
    journal.event(
        logging.ERROR,
        "republish failed",
        **who,
        day=day.isoformat(),
        republished=republished,
        reason=message,
    )
    raise RepublishFailed(message, republished)
