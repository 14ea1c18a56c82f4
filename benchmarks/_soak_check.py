"""The soak's checker: the database, the whole topic and the consumer's output, judged per reminder.

Every reminder row the workload made (and every message on the topic) is checked:

* **lost**: a reminder of a live event (never cancelled, or cancelled only after its DueAt and
  sent anyway) that is not Sent, not on the topic, or not notified to each recipient;
* **doubled**: on the topic with two different payloads, in the outbox twice, or one recipient
  notified twice;
* **sent_after_cancel**: a reminder whose event was cancelled before its DueAt (the cancel call
  had returned) that is Sent, on the topic or notified; and any message for a reminder the
  database does not hold (a moved event's deleted row).

After a failover the database is the new primary, and every judgement is against what it knows:
a reminder whose Sent commit was lost is Pending again there and is sent again, so two messages
with the same payload for one ReminderId are a re-send (counted, not doubled), while a recipient
notified twice is still doubled; a message published before the switch for a reminder the new
primary never heard of (its event's commit was lost) is counted apart, not as sent after cancel.

A fault's window runs from its start to the moment everything due before its end was notified
("back to normal"); the recovery is that moment minus the fault's end. Lateness (DueAt -> the
broker's timestamp) is reported outside every window (with a minute of lead-in) and inside.
A fault proves something only if its window held reminders: some fell due between its start and
its end, or were in flight when it began (due before, delivered after). One that held none is
reported as such and its kind's ``checked`` leaves it out.

What is judged (the rows, the topic, the notifications, the fault records and the workload's
events) is written to ``outcomes.json`` in the soak's work dir first (:func:`write_outcomes`), so
``--check`` can judge a kept run again (:func:`read_outcomes`).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from reminder_pipeline.domain import contract

from ._dueq import percentile
from ._soak_load import EventRecord
from ._soak_plan import KINDS
from ._soak_stack import FaultRecord

#: The topic is read until no message has come for this long and the watermarks agree.
QUIET_S = 5.0
#: Before a fault starts, reminders due this long before it may be delayed by it.
LEAD_IN_S = 60.0


@dataclass
class Row:
    reminder_id: str
    event_id: str
    due: float
    status: str
    event_status: str
    recipients: tuple[str, ...]
    outbox_rows: int
    #: Materialised Skipped: the row was created (an event created or moved while the calendar
    #: could not reach the database, retried) after its due time, the calendar's own rule
    #: ("offset in the past at materialisation"): nothing is owed for it.
    skipped_at_creation: bool = False


@dataclass
class Topic:
    messages: dict[str, list[tuple[float, bytes]]] = field(default_factory=dict)
    unreadable: int = 0


def read_topic(bootstrap: str, timeout: float = 300.0) -> Topic:
    """Every message of the contract topic, from the beginning to the high watermarks."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-check-{time.time_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    topic = Topic()
    parts = [TopicPartition(contract.TOPIC, p) for p in range(contract.PARTITIONS)]
    read: dict[int, int] = {}  # partition -> next offset
    try:
        consumer.assign(
            [TopicPartition(contract.TOPIC, p, OFFSET_BEGINNING) for p in range(len(parts))]
        )
        deadline = time.time() + timeout
        quiet_since = time.time()
        # To the high watermarks, then on until nothing has come for QUIET_S and the watermarks
        # (asked again) hold nothing more: a watermark can lag what a fetch already returns.
        while time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                if time.time() - quiet_since < QUIET_S:
                    continue
                highs = {
                    tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts
                }
                if all(read.get(p, 0) >= h for p, h in highs.items()):
                    return topic
                quiet_since = time.time()
                continue
            quiet_since = time.time()
            read[msg.partition()] = msg.offset() + 1
            value = msg.value() or b""
            try:
                rid = str(json.loads(value)["ReminderId"]).lower()
            except (ValueError, KeyError, TypeError):
                topic.unreadable += 1
                continue
            topic.messages.setdefault(rid, []).append((msg.timestamp()[1] / 1000.0, value))
        raise RuntimeError(f"the topic was not read to its end in {timeout:.0f} s")
    finally:
        consumer.close()


def read_rows(dsn: str) -> list[Row]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT r.id::text, e.id::text, extract(epoch FROM r.due_at), r.status, e.status,"
            " e.owner_user_id::text, e.client_user_id::text,"
            " (SELECT count(*) FROM outbox o WHERE o.reminder_id = r.id),"
            " r.status = 'Skipped' AND r.created_at >= r.due_at AND r.updated_at = r.created_at"
            " FROM event_reminders r JOIN calendar_events e ON e.id = r.calendar_event_id"
        ).fetchall()
    out = []
    for rid, eid, due, status, event_status, owner, client, outbox, at_creation in rows:
        recipients = (owner,) if client is None or client == owner else (owner, client)
        out.append(
            Row(rid, eid, float(due), status, event_status, recipients, int(outbox), at_creation)
        )
    return out


def write_outcomes(
    path: Path,
    rows: list[Row],
    topic: Topic,
    notified: list[tuple[float, str, str]],
    faults: list[FaultRecord],
    events: dict[str, EventRecord],
) -> None:
    """What :func:`check` judges, as one JSON object (payloads as text, byte for byte)."""
    data = {
        "rows": [asdict(r) for r in rows],
        "topic": {
            "messages": {
                rid: [[t, payload.decode("utf-8", "surrogateescape")] for t, payload in msgs]
                for rid, msgs in topic.messages.items()
            },
            "unreadable": topic.unreadable,
        },
        "notified": [list(n) for n in notified],
        "faults": [asdict(f) for f in faults],
        "events": {eid: {**asdict(e), "event_id": str(e.event_id)} for eid, e in events.items()},
    }
    path.write_text(json.dumps(data))


def read_outcomes(
    path: Path,
) -> tuple[
    list[Row], Topic, list[tuple[float, str, str]], list[FaultRecord], dict[str, EventRecord]
]:
    """What :func:`write_outcomes` wrote, as :func:`check` takes it (a field left out takes its
    default)."""
    data = json.loads(path.read_text())
    rows = [Row(**{**r, "recipients": tuple(r["recipients"])}) for r in data["rows"]]
    topic = Topic(
        {
            rid: [(t, payload.encode("utf-8", "surrogateescape")) for t, payload in msgs]
            for rid, msgs in data["topic"]["messages"].items()
        },
        data["topic"].get("unreadable", 0),
    )
    notified = [(float(at), str(rid), str(who)) for at, rid, who in data["notified"]]
    faults = [FaultRecord(**f) for f in data["faults"]]
    events = {
        eid: EventRecord(**{**e, "event_id": uuid.UUID(e["event_id"])})
        for eid, e in data["events"].items()
    }
    return rows, topic, notified, faults, events


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_s": None, "p95_s": None, "max_s": None}
    return {
        "n": len(values),
        "p50_s": round(statistics.median(values), 1),
        "p95_s": round(percentile(values, 95), 1),
        "max_s": round(max(values), 1),
    }


def check(
    rows: list[Row],
    topic: Topic,
    notified: list[tuple[float, str, str]],
    faults: list[FaultRecord],
    events: dict[str, EventRecord],
) -> dict:
    """The report: totals (the six top-level keys) and the same figures per fault kind."""
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
    for at, rid, recipient in notified:
        by_pair[(rid.lower(), recipient.lower())].append(at)
    known = {r.reminder_id for r in rows}
    # The moment the stack was switched to the new primary (a failover's end), if it was.
    switched = max((f.ended for f in faults if f.kind == "failover" and f.injected), default=None)
    status_lost: set[str] = set()  # delivered, then the Sent commit lost in a failover
    at_creation: set[str] = set()  # materialised Skipped: created after their due time
    lost: dict[str, str] = {}
    doubled: dict[str, str] = {}
    after_cancel: dict[str, str] = {}
    read_gaps: set[str] = set()
    done_at: dict[str, float] = {}  # reminder -> when its last recipient was notified
    lateness: dict[str, float] = {}
    for row in rows:
        msgs = topic.messages.get(row.reminder_id, [])
        times = [by_pair.get((row.reminder_id, u), []) for u in row.recipients]
        if msgs:
            lateness[row.reminder_id] = min(t for t, _ in msgs) - row.due
        if all(times):
            done_at[row.reminder_id] = max(min(t) for t in times)
        if len({payload for _, payload in msgs}) > 1 or row.outbox_rows > 1:
            doubled[row.reminder_id] = "published twice with different payloads"
        if any(len(t) > 1 for t in times):
            doubled[row.reminder_id] = "a recipient notified twice"
        sent = row.status == "Sent" or bool(msgs) or any(times)
        record = events.get(row.event_id)
        cancelled_at = record.cancelled_at if record else None
        if row.event_status == "Cancelled":
            if cancelled_at is not None and cancelled_at < row.due and sent:
                after_cancel[row.reminder_id] = "event cancelled before DueAt, reminder sent"
            if cancelled_at is None or cancelled_at < row.due or not sent:
                continue  # cancelled (when unknown, either outcome is right): nothing owed
        if row.skipped_at_creation and not sent:
            at_creation.add(row.reminder_id)
            continue
        if row.status != "Sent":
            if switched is not None and msgs and all(times) and min(t for t, _ in msgs) <= switched:
                # Delivered before a failover that lost its Sent commit; the new primary then
                # saw the event cancelled (after DueAt): delivered once, nothing owed.
                status_lost.add(row.reminder_id)
            else:
                lost[row.reminder_id] = f"{row.status}, not sent"
        elif not msgs and all(times):
            # The consumer reads only the topic: it was there, the checker's read missed it.
            read_gaps.add(row.reminder_id)
        elif not msgs:
            lost[row.reminder_id] = "Sent but not on the topic"
        elif not all(times):
            lost[row.reminder_id] = "on the topic but not notified"
    unknown_to_new_primary: dict[str, str] = {}
    for rid, msgs in topic.messages.items():
        if rid in known:
            continue
        if switched is not None and min(t for t, _ in msgs) <= switched:
            unknown_to_new_primary[rid] = (
                "published before the failover, unknown to the new primary"
            )
        else:
            after_cancel[rid] = "on the topic, no such reminder in the database"
    resent = [
        rid
        for rid, msgs in topic.messages.items()
        if len(msgs) > 1 and len({payload for _, payload in msgs}) == 1
    ]

    held = [_held(rows, fault, done_at) if fault.injected else None for fault in faults]
    windows = _windows(rows, faults, done_at)
    due = {r.reminder_id: r.due for r in rows}

    def in_window(rid: str, kind: str | None = None, proven_only: bool = False) -> bool:
        d = due.get(rid)
        return d is not None and any(
            (kind is None or k == kind)
            and (held_some or not proven_only)
            and start - LEAD_IN_S <= d <= end
            for k, start, end, _, held_some in windows
        )

    outside = [v for rid, v in lateness.items() if not in_window(rid)]
    recovered = [w[3] for w in windows if w[3] is not None]
    by_kind = {}
    for kind in KINDS:
        mine = [w for w in windows if w[0] == kind]
        ids = {r.reminder_id for r in rows if in_window(r.reminder_id, kind, proven_only=True)}
        rec = [w[3] for w in mine if w[3] is not None]
        by_kind[kind] = {
            "faults": len(mine),
            "held_no_reminder": sum(1 for w in mine if not w[4]),
            "checked": len(ids),
            "lost": len(ids & lost.keys()),
            "doubled": len(ids & doubled.keys()),
            "sent_after_cancel": len(ids & after_cancel.keys()),
            "lateness_in_window": _stats([lateness[i] for i in ids if i in lateness]),
            "recovery_max_s": round(max(rec), 1) if rec else None,
            "not_recovered": sum(1 for w in mine if w[3] is None),
        }
    statuses = Counter(r.status for r in rows)
    return {
        "faults": len(windows),
        "checked": len(rows),
        "lost": len(lost),
        "doubled": len(doubled),
        "sent_after_cancel": len(after_cancel),
        "recovery_max_s": round(max(recovered), 1) if recovered else None,
        "faults_by_kind": {k: v["faults"] for k, v in by_kind.items()},
        "faults_not_injected": [
            {"kind": f.kind, "planned_s": f.planned_s, "detail": f.detail}
            for f in faults
            if not f.injected
        ],
        "faults_held_no_reminder": sum(1 for w in windows if not w[4]),
        # Per fault, in the order given (None: not injected): reminders due inside its window
        # and reminders in flight when it began.
        "fault_windows": [
            None if h is None else {"due_in_window": h[0], "in_flight": h[1]} for h in held
        ],
        "not_recovered": sum(1 for w in windows if w[3] is None),
        "lateness_outside_faults": _stats(outside),
        "lateness_all": _stats(list(lateness.values())),
        "statuses": dict(statuses),
        "cancelled_before_due": sum(
            1
            for r in rows
            if (rec := events.get(r.event_id)) and rec.cancelled_at and rec.cancelled_at < r.due
        ),
        "on_topic": sum(len(v) for v in topic.messages.values()),
        "notified_but_not_read_from_topic": len(read_gaps),
        "notifications": len(notified),
        "resent_same_payload": len(resent),
        "unknown_to_new_primary": len(unknown_to_new_primary),
        "delivered_before_failover_then_cancelled": len(status_lost),
        "skipped_at_creation": len(at_creation),
        "examples": {
            "lost": dict(list(lost.items())[:5]),
            "doubled": dict(list(doubled.items())[:5]),
            "sent_after_cancel": dict(list(after_cancel.items())[:5]),
            "unknown_to_new_primary": dict(list(unknown_to_new_primary.items())[:5]),
        },
        "by_kind": by_kind,
    }


def _held(rows: list[Row], fault: FaultRecord, done_at: dict[str, float]) -> tuple[int, int]:
    """(reminders due from the fault's start to its end, reminders in flight when it began: due
    before, and Sent but not yet notified to every recipient at its start)."""
    due_inside = sum(1 for r in rows if fault.started <= r.due <= fault.ended)
    in_flight = sum(
        1
        for r in rows
        if r.due < fault.started
        and r.status == "Sent"
        and done_at.get(r.reminder_id, float("inf")) > fault.started
    )
    return due_inside, in_flight


def _windows(
    rows: list[Row], faults: list[FaultRecord], done_at: dict[str, float]
) -> list[tuple[str, float, float, float | None, bool]]:
    """(kind, start, back to normal, recovery seconds or None, whether it held a reminder) of
    each injected fault."""
    out = []
    for fault in faults:
        if not fault.injected:
            continue
        held_some = sum(_held(rows, fault, done_at)) > 0
        owed = [r for r in rows if fault.started - LEAD_IN_S <= r.due <= fault.ended]
        owed = [r for r in owed if r.status == "Sent"]
        if any(r.reminder_id not in done_at for r in owed):
            out.append((fault.kind, fault.started, fault.ended, None, held_some))
            continue
        back = max((done_at[r.reminder_id] for r in owed), default=fault.ended)
        recovery = max(0.0, back - fault.ended)
        out.append((fault.kind, fault.started, max(back, fault.ended), recovery, held_some))
    return out


def table(report: dict) -> str:
    """The report for people: one line per fault kind, then the totals."""
    head = (
        f"{'fault kind':<28} {'faults':>6} {'empty':>5} {'checked':>7} {'lost':>5} {'doubled':>7} "
    )
    head += (
        f"{'sent after cancel':>17} {'late p95 s':>10} {'late max s':>10} {'recovery max s':>14}"
    )
    lines = [head]
    for kind, v in report["by_kind"].items():
        lat = v["lateness_in_window"]
        lines.append(
            f"{kind:<28} {v['faults']:>6} {v['held_no_reminder']:>5} {v['checked']:>7} "
            f"{v['lost']:>5} {v['doubled']:>7} "
            f"{v['sent_after_cancel']:>17} {_f(lat['p95_s']):>10} {_f(lat['max_s']):>10} "
            f"{_f(v['recovery_max_s']):>14}"
        )
    out = report["lateness_outside_faults"]
    lines.append(
        f"{'total':<28} {report['faults']:>6} {report['faults_held_no_reminder']:>5} "
        f"{report['checked']:>7} {report['lost']:>5} "
        f"{report['doubled']:>7} {report['sent_after_cancel']:>17} {_f(out['p95_s']):>10} "
        f"{_f(out['max_s']):>10} {_f(report['recovery_max_s']):>14}"
    )
    lines.append(
        "(per kind: empty = faults whose window held no reminder (none due in it, none in "
        "flight), not counted in checked; lateness of reminders due inside that kind's other "
        f"windows; total: outside every fault window, {out['n']} reminders; "
        f"{report['on_topic']} messages on the topic, {report['resent_same_payload']} "
        f"reminders published again with the same payload, {report['notifications']} "
        f"notifications, {report['notified_but_not_read_from_topic']} notified but missed by "
        "the checker's read of the topic)"
    )
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
