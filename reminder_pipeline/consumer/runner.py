"""The reference notifications consumer of pin.calendar.reminder-due.v1: the contract's other side.

At least once, in key order, never twice:

* a consumer group with manual commits, each made only after its message is handled (notified,
  recognised as a duplicate, or safely in the dead-letter topic);
* a failed attempt holds the message's partition (pause, then seek back once it is handled), so
  later reminders of the same event never overtake it while other partitions keep flowing;
* reading a message into notifications (parsing, the local time, the text) is deterministic: any
  error there, expected or not, counts toward a bounded number of attempts, then the message is
  copied to the dead-letter topic with the reason in its headers and the partition moves on;
* delivering is not: sink and de-duplication store failures are outages, retried with capped
  exponential back-off without limit (the contract: the partition does not move past them);
* no message holds a partition for good: a dead-letter copy too big for the broker is cut to fit
  (the original's position, size and SHA-256 in its headers), and one the broker refuses even
  then is skipped and counted (a permanent outcome of that message, not an outage);
* a rebalance never strands a partition: librdkafka keeps an application's pause across revoke
  and re-assign, so every partition is resumed when it is assigned;
* ReminderId de-duplication in a durable store, so a redelivery never notifies twice (on one
  host with the SQLite file, on every host with the shared PostgreSQL store);
* a reminder whose StartAt passed more than a grace ago is dropped, counted and logged;
* a de-dup store or a broker that goes away is an outage (:mod:`.outages`): logged once when it
  starts and once when it ends, never per message; the partitions of the messages it failed stay
  held (key order) and are retried as soon as a probe finds the server answering again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ..config import KafkaSettings
from ..logs import event
from ..memory import BATCH_LOOP_GEN0_THRESHOLD, young_generation
from ..messaging.kafka import LIBRDKAFKA_LOG
from . import kafka_messages
from .dead_letters import DeadLetters
from .dedup import DedupStore, DedupStoreUnavailable
from .handling import MessageHandling, PartitionProgress, Retry
from .metrics import ConsumerMetrics
from .options import ConsumerOptions, ConsumeStats
from .outages import Outage
from .sinks import NotificationSink
from .texts import parse_locale

log = logging.getLogger(__name__)


#: librdkafka's prefetch, in KiB, across the member's partitions (``queued.max.messages.kbytes``):
#: ~8 batches of 2,000 contract messages, so a poll never waits on a backlog, while the member's
#: memory stays flat however long the backlog is. The default, 64 MiB, put ~40 MB more on a
#: member's peak RSS with a 150,000 backlog at the same throughput (benchmarks.consumer).
QUEUED_MAX_KBYTES = 16_384
#: librdkafka's ``max.poll.interval.ms`` (its default 300,000): why, in ``consumer_config``.
MAX_POLL_INTERVAL_MS = 60 * 1000


@dataclass
class _Held:
    """A message that failed and holds its partition until it is handled."""

    message: Message
    attempts: int
    read_failures: int
    retry_at: float


class ReminderConsumer:
    """Consumes reminder-due messages and delivers their notifications to a sink."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sink: NotificationSink,
        dedup: DedupStore,
        options: ConsumerOptions | None = None,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self.kafka = kafka
        self.sink = sink
        self.dedup = dedup
        self.options = options or ConsumerOptions()
        self.locale = parse_locale(self.options.locale)
        self.metrics = metrics or ConsumerMetrics()
        self.stats = ConsumeStats()
        self.assigned = threading.Event()
        #: Partitions this member owns now, and how many assignments it has received (tests
        #: and operators can see a rebalance happen).
        self.owned: frozenset[int] = frozenset()
        self.assignments = 0
        self._consumer: Consumer | None = None
        #: The dead-letter producer and the message handling of the current run.
        self._dead_letters: DeadLetters | None = None
        self._handling: MessageHandling | None = None
        self._held: dict[tuple[str, int], _Held] = {}
        self._assigned_at = 0.0
        first_probe = self.options.retry_backoff_seconds
        group_id = self.options.group_id
        self.store_outage = Outage(
            "dedup_store", self.metrics, group_id=group_id, first_probe_seconds=first_probe
        )
        self.broker_outage = Outage(
            "broker", self.metrics, group_id=group_id, first_probe_seconds=first_probe
        )

    def consumer_config(self) -> dict[str, Any]:
        """librdkafka properties of the consumer."""
        return {
            **self.kafka.client_config(),
            "group.id": self.options.group_id,
            "client.id": "reminder-notifications",
            "logger": LIBRDKAFKA_LOG,  # librdkafka's own lines at DEBUG, never raw on stderr
            # Commits are made by hand, one per handled message: never ahead of the work.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # A new group starts from the oldest retained reminder rather than missing the ones
            # published before it first joined (duplicates are harmless, losses are not).
            "auto.offset.reset": "earliest",
            # Shorter than librdkafka's 45 s: a dead consumer's partitions move on well within
            # the contract's one-minute SLA (and the embedded broker joins in ~session/2).
            "session.timeout.ms": 10 * 1000,
            "heartbeat.interval.ms": 3 * 1000,
            # Between two polls the loop waits on one batch at most: the de-dup store's read
            # bound and one reconnect (15 s), or the dead-letter flush (15 s). A loop stuck past
            # twice both has lost its bounds: its member leaves the group and its partitions move
            # to a live member within a minute, not librdkafka's 5 (docs/configuration.md).
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "enable.partition.eof": False,
            # What librdkafka fetches ahead, in all (one queue for the member's partitions).
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
            **self.options.consumer_config,
        }

    def held_partitions(self) -> list[int]:
        """Partitions stopped on a message that waits for a retry."""
        # A snapshot: another thread (a test, a health probe) may ask while the loop runs.
        return sorted(partition for _topic, partition in list(self._held))

    # -- the loop --------------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        join_timeout: float = 60.0,
    ) -> ConsumeStats:
        """Consume until ``stop`` is set, ``max_messages`` are handled, or ``idle_timeout`` passes.

        The idle clock starts once partitions are assigned and does not run while a message is
        held for retry. ``join_timeout`` bounds the wait for an assignment when ``idle_timeout``
        is given (a bounded run must end even if the group never forms).
        """
        stop = stop or threading.Event()
        options = self.options
        self.stats = ConsumeStats()
        self._dead_letters = DeadLetters(self.kafka, options, self.stats, self.metrics)
        self._handling = MessageHandling(
            self.sink,
            self.dedup,
            options,
            self.locale,
            self.stats,
            self.metrics,
            self._dead_letters,
        )
        self.assigned.clear()
        consumer = Consumer(self.consumer_config())
        self._consumer = consumer
        started = time.monotonic()
        consumer.subscribe(
            [options.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        event(
            log,
            logging.INFO,
            "consumer started",
            group_id=options.group_id,
            topic=options.topic,
            dlq_topic=options.dlq_topic,
            locale=self.locale.value,
        )
        try:
            # A batch of up to ``batch_size`` messages allocates ~15 objects per message that live
            # until the batch is recorded; with the default threshold young collections took a
            # quarter of a member's CPU per message (benchmarks/README.md).
            with young_generation(BATCH_LOOP_GEN0_THRESHOLD):
                self._loop(stop, max_messages, idle_timeout, join_timeout, started)
        finally:
            self._close()
        event(
            log, logging.INFO, "consumer stopped", group_id=options.group_id, **self.stats.as_dict()
        )
        return self.stats

    def _loop(
        self,
        stop: threading.Event,
        max_messages: int | None,
        idle_timeout: float | None,
        join_timeout: float,
        started: float,
    ) -> None:
        """Poll and handle until ``stop``, ``max_messages`` or the idle timeout (:meth:`run`)."""
        options = self.options
        consumer = self._consumer
        assert consumer is not None
        last_activity = started
        while not stop.is_set():
            if max_messages is not None and self.stats.messages >= max_messages:
                break
            self._probe_outages(time.monotonic())
            self._retry_due(time.monotonic())
            wanted = options.batch_size
            if max_messages is not None:
                wanted = max(1, min(wanted, max_messages - self.stats.messages))
            messages = consumer.consume(wanted, self._poll_timeout())
            now = time.monotonic()
            if not messages:
                if idle_timeout is None or self._held:
                    continue
                if self.assigned.is_set():
                    if now - max(last_activity, self._assigned_at) >= idle_timeout:
                        event(
                            log,
                            logging.INFO,
                            "consumer idle; stopping",
                            group_id=options.group_id,
                            idle_seconds=idle_timeout,
                        )
                        break
                elif now - started >= join_timeout:
                    event(
                        log,
                        logging.WARNING,
                        "no partitions assigned in time; stopping",
                        group_id=options.group_id,
                        join_timeout_seconds=join_timeout,
                    )
                    break
                continue
            last_activity = now
            for batch in self._batches(messages):
                self._process(batch, attempt=1, read_failures=0)

    def _poll_timeout(self) -> float:
        """Poll no longer than until the next held message is due for another attempt."""
        now = time.monotonic()
        timeout = self.options.poll_timeout_seconds
        if self._held:
            next_retry = min(h.retry_at for h in self._held.values())
            timeout = min(timeout, max(next_retry - now, 0.0))
        for outage in (self.store_outage, self.broker_outage):
            probe_in = outage.seconds_to_probe(now)
            if probe_in is not None:
                timeout = min(timeout, probe_in)
        return timeout

    def _probe_outages(self, now: float) -> None:
        """Probe a server that is away; when it answers, retry what its outage held, now."""
        assert self._consumer is not None
        if self.store_outage.probe_due(now):
            try:
                self.dedup.ping()
            except DedupStoreUnavailable:
                self.store_outage.probe_failed(time.monotonic())
            else:
                self.store_outage.end(time.monotonic())
                for held in self._held.values():
                    if held.retry_at == math.inf:
                        held.retry_at = now
        if self.broker_outage.probe_due(now):
            try:
                self._consumer.list_topics(self.options.topic, timeout=2.0)
            except KafkaException:
                self.broker_outage.probe_failed(time.monotonic())
            else:
                self.broker_outage.end(time.monotonic())

    def _batches(self, messages: list[Message]) -> list[list[Message]]:
        """The polled messages as one batch per partition, in offset order; errors reported."""
        batches: dict[tuple[str, int], list[Message]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                self._on_error(error)
                continue
            self.broker_outage.end(time.monotonic())
            key = kafka_messages.position(message)[:2]
            if key in self._held:
                continue  # prefetched behind a held message: read again after the seek
            batches.setdefault(key, []).append(message)
        return list(batches.values())

    def _retry_due(self, now: float) -> None:
        for held in [h for h in self._held.values() if h.retry_at <= now]:
            self._process(
                [held.message], attempt=held.attempts + 1, read_failures=held.read_failures
            )

    def _process(self, messages: list[Message], attempt: int, read_failures: int) -> None:
        """Attempt one partition's batch; commit what is handled, hold the partition on the rest.

        In this order: the store asked once, the notifications delivered, recorded in one write
        (:meth:`MessageHandling.handle_batch`), then the handled messages' offsets committed.
        """
        while messages:
            done = self._attempt(messages, attempt, read_failures)
            if done is None or done == len(messages):
                return
            # A message after the batch's read failure, or after a dead-lettered one: its turn.
            messages, attempt, read_failures = messages[done:], 1, 0

    def _attempt(self, messages: list[Message], attempt: int, read_failures: int) -> int | None:
        """Handle the leading messages of ``messages``; how many, or None when one is held."""
        assert self._consumer is not None and self._handling is not None
        first = messages[0]
        topic, partition, _offset = kafka_messages.position(first)
        key = (topic, partition)
        try:
            if self.store_outage.active:
                # The store is away (a probe finds it back): asking it for each partition's batch
                # would block the loop a connect time-out per batch, past max.poll.interval.ms.
                raise DedupStoreUnavailable("the de-dup store is in an outage")
            outcome = self._handling.handle_batch(messages, attempt, read_failures)
        except DedupStoreUnavailable as exc:
            # Logged once per outage, not per message; the batch waits for the store to answer
            # (a probe releases it), its partition held so nothing of its key overtakes it.
            self.store_outage.begin(kafka_messages.one_line(exc), time.monotonic())
            self.metrics.retries.labels("deliver").inc()
            outcome = PartitionProgress(0, Retry(math.inf, read_failed=False))
        except Exception as exc:  # noqa: BLE001 - an outage or a bug must not skip a reminder
            retry_in = self.options.backoff(attempt)
            self.metrics.retries.labels("deliver").inc()
            event(
                log,
                logging.ERROR,
                "message handling failed; will retry",
                **kafka_messages.where(first),
                attempt=attempt,
                retry_in_seconds=retry_in,
                error=kafka_messages.one_line(exc),
            )
            outcome = PartitionProgress(0, Retry(retry_in, read_failed=False))
        if outcome.done:
            last = messages[outcome.done - 1]
            self._commit(last)
            self.stats.messages += outcome.done
            if self._held.pop(key, None) is not None:
                self.metrics.held_partitions.set(len(self._held))
                if outcome.retry is None:
                    # Messages prefetched behind the held one were dropped: read them again.
                    self._consumer.seek(
                        TopicPartition(topic, partition, kafka_messages.position(last)[2] + 1)
                    )
                    self._consumer.resume([TopicPartition(topic, partition)])
        retry = outcome.retry
        if retry is None:
            return outcome.done
        message = messages[outcome.done]
        tries, failures = (attempt, read_failures) if outcome.done == 0 else (1, 0)
        self.stats.retries += 1
        if key not in self._held:
            self._consumer.pause([TopicPartition(topic, partition)])
        self._held[key] = _Held(
            message, tries, failures + retry.read_failed, time.monotonic() + retry.seconds
        )
        self.metrics.held_partitions.set(len(self._held))
        return None

    def _commit(self, message: Message) -> None:
        """Commit past ``message``; a failure means a redelivery, possibly to another member.

        De-duplication absorbs it only where that member sees the same store: always with
        ``--dedup-url`` (PostgreSQL), only on this host with the SQLite file.
        """
        assert self._consumer is not None
        try:
            self._consumer.commit(message=message, asynchronous=False)
        except KafkaException as exc:
            self.stats.commit_failures += 1
            event(
                log,
                logging.WARNING,
                "offset commit failed; the message may be redelivered",
                **kafka_messages.where(message),
                error=str(exc.args[0]) if exc.args else str(exc),
            )

    # -- group membership and errors ---------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # librdkafka keeps an application's pause across revoke and re-assign: a partition
        # paused for a message held before a rebalance would never deliver again. Nothing is
        # held for a partition just assigned (its held message was forgotten on revoke and is
        # read again from the committed offset), so every one of them flows.
        if partitions:
            consumer.resume(partitions)
        self.owned = self.owned | {p.partition for p in partitions}
        self.assignments += 1
        self._assigned_at = time.monotonic()
        self.assigned.set()
        self.metrics.assigned_partitions.set(len(self.owned))
        event(
            log,
            logging.INFO,
            "partitions assigned",
            group_id=self.options.group_id,
            partitions=sorted(p.partition for p in partitions),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A held message belongs to its partition's next owner now: it resumes from the
        # committed offset, which is still before the held message.
        for p in partitions:
            self._held.pop((p.topic, p.partition), None)
        self.owned = self.owned - {p.partition for p in partitions}
        self.metrics.held_partitions.set(len(self._held))
        self.metrics.assigned_partitions.set(len(self.owned))
        event(
            log,
            logging.INFO,
            "partitions revoked",
            group_id=self.options.group_id,
            partitions=sorted(p.partition for p in partitions),
        )

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            # librdkafka reconnects by itself (with its own back-off); the outage is logged once
            # and ends when a message arrives or a metadata probe is answered.
            self.broker_outage.begin(f"{error.name()}: {error.str()}", time.monotonic())
            return
        if self.broker_outage.active and error.code() == KafkaError._TRANSPORT:
            return  # each failed reconnect during the outage: already reported
        event(
            log,
            logging.WARNING,
            "consumer error",
            group_id=self.options.group_id,
            code=error.name(),
            error=error.str(),
        )

    def _close(self) -> None:
        if self._dead_letters is not None:
            self._dead_letters.close()
            self._dead_letters = None
        self._handling = None
        if self._consumer is not None:
            # Leaves the group; nothing is committed here, so held messages are redelivered.
            self._consumer.close()
            self._consumer = None
        self._held.clear()
        self.owned = frozenset()
        self.metrics.held_partitions.set(0)
        self.metrics.assigned_partitions.set(0)
