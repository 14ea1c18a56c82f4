"""``reminder-pipeline reminders`` on the real database: support finds reminders by who and when.

Each filter (owner, client, tenant, event, status, kind, a due range with a day alone meaning
that UTC day) takes exactly its reminders, newest due first; filters combine; pages follow one
another by their cursor without a repeat or a gap, ties on DueAt included; the text prints one
line per reminder and the next page's command, runnable as printed; ``--json`` is the trace's
items and the cursor. A bad status, kind, id, time, limit or cursor is one line (exit 2) naming
it, a status or kind listing the valid ones.
"""

from __future__ import annotations

import base64
import json
import shlex
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest
import sqlalchemy as sa

from reminder_pipeline import cycle
from reminder_pipeline.cli import main
from reminder_pipeline.config import parse_range_end
from reminder_pipeline.operator_jobs import finder
from reminder_pipeline_tests.support import make_event_due_on, reminders, utcnow

UI_PORT = "3124"


@dataclass
class Calendar:
    """Reminders of two owners, two clients and two tenants around one day (ids by name)."""

    day: date
    owner: uuid.UUID
    other_owner: uuid.UUID
    client: uuid.UUID
    tenant: uuid.UUID
    other_tenant: uuid.UUID
    ids: dict[str, str]  # name -> ReminderId
    events: dict[str, str]  # name -> EventId


@pytest.fixture
def calendar(engine, publisher) -> Calendar:
    day = (utcnow() - timedelta(days=3)).date()
    owner, other_owner, client = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    tenant, other_tenant = uuid.uuid4(), uuid.uuid4()
    specs = {
        # name: (day, hour, offsets, fields)
        "showing": (
            day,
            10,
            (60,),
            {
                "owner_user_id": owner,
                "client_user_id": client,
                "tenant_id": tenant,
                "kind": "Showing",
            },
        ),
        "meeting_late": (
            day,
            23.9999,
            (60,),
            {"owner_user_id": owner, "tenant_id": tenant, "kind": "Meeting"},
        ),
        "first_instant": (
            day,
            0,
            (60,),
            {"owner_user_id": other_owner, "tenant_id": tenant, "kind": "Task"},
        ),
        "cancelled_next_day": (
            day + timedelta(days=1),
            0,
            (60,),
            {
                "owner_user_id": other_owner,
                "client_user_id": client,
                "tenant_id": other_tenant,
                "kind": "Task",
                "status": "Cancelled",
            },
        ),
        "day_before": (
            day - timedelta(days=1),
            23.99,
            (60,),
            {
                "owner_user_id": owner,
                "client_user_id": client,
                "tenant_id": tenant,
                "kind": "Showing",
            },
        ),
    }
    events = {
        name: make_event_due_on(engine, d, hour, offsets=offsets, **fields)
        for name, (d, hour, offsets, fields) in specs.items()
    }
    assert cycle.run_cycle(engine, publisher, batch_size=100).counts.sent == 4
    future = make_event_due_on(  # Pending, not due yet
        engine,
        (utcnow() + timedelta(days=2)).date(),
        12,
        owner_user_id=owner,
        tenant_id=tenant,
        kind="Consultation",
    )
    events["future"] = future
    ids = {name: str(reminders(engine, e)[0]["id"]) for name, e in events.items()}
    return Calendar(
        day,
        owner,
        other_owner,
        client,
        tenant,
        other_tenant,
        ids,
        {n: str(e) for n, e in events.items()},
    )


def _find(engine, *, limit: int = 50, after=None, **filters) -> list[str]:
    items, _ = finder.find(
        engine, finder.Filters(**filters), limit=limit, after=after, ui_url="http://ui"
    )
    return [i["reminder_id"] for i in items]


def test_each_filter_takes_exactly_its_reminders_newest_due_first(engine, calendar):
    c, ids = calendar, calendar.ids
    day_start = datetime.combine(c.day, datetime.min.time(), tzinfo=UTC)

    def names(found: list[str]) -> list[str]:
        by_id = {v: k for k, v in ids.items()}
        return [by_id[i] for i in found]

    everything = [
        "future",
        "cancelled_next_day",
        "meeting_late",
        "showing",
        "first_instant",
        "day_before",
    ]
    assert names(_find(engine)) == everything  # no filter: all, newest due first
    assert names(_find(engine, owner=c.owner)) == [
        "future",
        "meeting_late",
        "showing",
        "day_before",
    ]
    assert names(_find(engine, client=c.client)) == ["cancelled_next_day", "showing", "day_before"]
    assert names(_find(engine, tenant=c.other_tenant)) == ["cancelled_next_day"]
    assert names(_find(engine, event=uuid.UUID(c.events["showing"]))) == ["showing"]
    assert names(_find(engine, statuses=("Skipped",))) == ["cancelled_next_day"]
    assert names(_find(engine, statuses=("Pending", "Skipped"))) == ["future", "cancelled_next_day"]
    assert names(_find(engine, kind="Task")) == ["cancelled_next_day", "first_instant"]
    # A day alone is that UTC day: its first instant in, the next day's first instant out.
    due_from, due_before = finder.due_range(c.day.isoformat(), c.day.isoformat())
    the_day = {"due_from": due_from, "due_before": due_before}
    assert the_day == {"due_from": day_start, "due_before": day_start + timedelta(days=1)}
    assert names(_find(engine, **the_day)) == ["meeting_late", "showing", "first_instant"]
    assert names(_find(engine, due_from=day_start + timedelta(hours=10))) == [
        "future",
        "cancelled_next_day",
        "meeting_late",
        "showing",
    ]
    # due_to as a time is inclusive: the reminder due exactly then is in.
    at_ten = (day_start + timedelta(hours=10)).isoformat()
    assert names(_find(engine, due_before=parse_range_end(at_ten, "due_to"))) == [
        "showing",
        "first_instant",
        "day_before",
    ]
    # Combinations: support's case (a client and a day), an owner's sent reminders of a kind.
    assert names(_find(engine, client=c.client, **the_day)) == ["showing"]
    assert names(_find(engine, owner=c.owner, statuses=("Sent",), kind="Showing")) == [
        "showing",
        "day_before",
    ]
    assert _find(engine, owner=c.other_owner, client=c.client, kind="Meeting") == []


def test_pages_follow_by_cursor_without_repeats_or_gaps_ties_included(engine):
    due = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    # 11 reminders, 7 of them due at the same instant (ties broken by ReminderId).
    dues = [due] * 7 + [due + timedelta(minutes=m) for m in (1, 2, -5, -6)]
    with engine.begin() as conn:
        for when in dues:
            event_id = uuid.uuid4()
            conn.execute(
                sa.text(
                    "INSERT INTO calendar_events (id, tenant_id, owner_user_id, kind, start_at, "
                    "time_zone) VALUES (:id, :t, :o, 'Task', :start, 'UTC')"
                ),
                {"id": event_id, "t": uuid.uuid4(), "o": uuid.uuid4(), "start": when},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO event_reminders (id, calendar_event_id, offset_minutes, due_at) "
                    "VALUES (:id, :e, 0, :due)"
                ),
                {"id": uuid.uuid4(), "e": event_id, "due": when},
            )
        expected = [
            str(r.id)
            for r in conn.execute(
                sa.text("SELECT id FROM event_reminders ORDER BY due_at DESC, id DESC")
            )
        ]

    seen: list[str] = []
    after, pages = None, 0
    while True:
        items, cursor = finder.find(engine, finder.Filters(), limit=3, after=after, ui_url="u")
        seen += [i["reminder_id"] for i in items]
        pages += 1
        if cursor is None:
            break
        after = finder.decode_cursor(cursor, finder.Filters())
    assert seen == expected and pages == 4  # 3 + 3 + 3 + 2, in order, none twice
    # Exactly a page's worth: no cursor after the last page.
    items, cursor = finder.find(engine, finder.Filters(), limit=11, ui_url="u")
    assert len(items) == 11 and cursor is None


def _cli(monkeypatch, capsys, database_url, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("DAGSTER_WEBSERVER_PORT", UI_PORT)
    code = main(["reminders", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_text_is_a_line_each_and_the_next_page_command_runs_as_printed(
    engine, calendar, database_url, monkeypatch, capsys
):
    c = calendar
    code, out, err = _cli(
        monkeypatch, capsys, database_url, "--owner", str(c.owner), "--limit", "2"
    )
    assert code == 0, err
    header, first, second, hint = out.splitlines()
    assert header.split() == [
        "reminder_id",
        "event_id",
        "kind",
        "due_at",
        "status",
        "owner_user_id",
        "client_user_id",
        "tenant_id",
        "reason",
    ]
    assert first.split()[:3] == [c.ids["future"], c.events["future"], "Consultation"]
    assert first.split()[4] == "Pending" and "not due yet (due at " in first
    # Whose it is, the person's id to pivot on (no client here: "-").
    assert first.split()[5:8] == [str(c.owner), "-", str(c.tenant)]
    assert second.split()[:3] == [c.ids["meeting_late"], c.events["meeting_late"], "Meeting"]
    assert second.split()[4] == "Sent" and "sent " in second and ";" not in second
    assert hint.startswith("next page: ") and " reminders --owner " in hint
    words = shlex.split(hint.removeprefix("next page: "))
    code, out, err = _cli(monkeypatch, capsys, database_url, *words[words.index("reminders") + 1 :])
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == [c.ids["showing"], c.ids["day_before"]]
    assert len(lines) == 3  # the last page: no hint

    code, out, _ = _cli(monkeypatch, capsys, database_url, "--tenant", str(uuid.uuid4()))
    assert code == 0 and out.strip() == "no reminder matches"


def test_json_is_the_trace_items_and_the_cursor(
    engine, calendar, database_url, monkeypatch, capsys
):
    c = calendar
    code, out, err = _cli(
        monkeypatch,
        capsys,
        database_url,
        "--client",
        str(c.client),
        "--due-from",
        c.day.isoformat(),
        "--due-to",
        c.day.isoformat(),
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"reminders", "next"} and data["next"] is None
    [item] = data["reminders"]
    for key in (
        "reminder_id",
        "event_id",
        "kind",
        "owner_user_id",
        "client_user_id",
        "tenant_id",
        "due_at",
        "status",
        "reason",
        "run_url",
        "partition",
        "offset",
    ):
        assert key in item
    assert (item["reminder_id"], item["kind"], item["status"]) == (
        c.ids["showing"],
        "Showing",
        "Sent",
    )
    people = (item["owner_user_id"], item["client_user_id"], item["tenant_id"])
    assert people == (str(c.owner), str(c.client), str(c.tenant))

    code, out, _ = _cli(
        monkeypatch,
        capsys,
        database_url,
        "--status",
        "sent",
        "--status",
        "SKIPPED",
        "--limit",
        "1",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and [i["reminder_id"] for i in data["reminders"]] == [
        c.ids["cancelled_next_day"]
    ]
    the_search = finder.Filters(statuses=("Sent", "Skipped"))
    assert finder.decode_cursor(data["next"], the_search)[1] == uuid.UUID(
        c.ids["cancelled_next_day"]
    )


def test_the_last_day_and_isos_compact_day_are_days(
    engine, calendar, database_url, monkeypatch, capsys
):
    """``--due-to 9999-12-31`` (or its last microsecond) is no upper bound: the day after it used
    to overflow (a traceback, exit 1). ``20261207`` is ISO-8601's compact day, that UTC day."""
    everything = sorted(calendar.ids.values())
    for end in ("9999-12-31", "9999-12-31T23:59:59.999999Z"):
        code, out, err = _cli(monkeypatch, capsys, database_url, "--due-to", end, "--json")
        assert (code, err) == (0, "")
        assert sorted(i["reminder_id"] for i in json.loads(out)["reminders"]) == everything
    day = calendar.day.strftime("%Y%m%d")
    code, out, err = _cli(
        monkeypatch,
        capsys,
        database_url,
        *("--client", str(calendar.client), "--due-from", day, "--due-to", day, "--json"),
    )
    assert (code, err) == (0, "")
    assert [i["reminder_id"] for i in json.loads(out)["reminders"]] == [calendar.ids["showing"]]


_CLIENT = uuid.UUID("5f0c1e6a-0000-4000-8000-000000000001")
_POSITION = (datetime(2026, 1, 1, tzinfo=UTC), uuid.UUID("0b7e0000-0000-4000-8000-000000000002"))
#: What a page of `reminders --client _CLIENT` prints, and the same with its position edited.
_CURSOR = finder.encode_cursor(finder.Filters(client=_CLIENT), *_POSITION)
_EDITED = base64.urlsafe_b64encode(
    base64.urlsafe_b64decode(_CURSOR + "=" * (-len(_CURSOR) % 4)).replace(b"2026-01", b"2026-02")
).decode()
_HAND_MADE = base64.urlsafe_b64encode(
    f"{_POSITION[0].isoformat()}|{_POSITION[1]}".encode()
).decode()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--status", "Nonsense"],
            "--status='Nonsense' is not a reminder status (one of Pending, Sent, Skipped)",
        ),
        (
            ["--kind", "Nonsense"],
            "--kind='Nonsense' is not an event kind (one of Showing, "
            "Consultation, Meeting, Task, BookingDeadline)",
        ),
        (["--owner", "42"], "--owner='42' is not an id (a UUID)"),
        (["--client", "Ivanov"], "--client='Ivanov' is not an id (a UUID)"),
        (["--due-from", "tuesday"], "--due-from='tuesday' is not an ISO-8601 timestamp"),
        (["--due-to", "2026-12-01T10:00"], "--due-to='2026-12-01T10:00:00' has no time zone"),
        (  # named as typed, not as the finder's fields (due_from, due_before)
            ["--due-from", "2026-12-02", "--due-to", "2026-12-01"],
            "--due-from='2026-12-02' is after --due-to='2026-12-01': no reminder could match",
        ),
        (
            ["--due-from", "20261202", "--due-to", "2026-12-01T23:00:00Z"],
            "--due-from='20261202' is after --due-to='2026-12-01T23:00:00Z'",
        ),
        (["--limit", "0"], "--limit=0 is out of range [1, 1000]"),
        (["--limit", "\u0663"], "--limit='\u0663' is not an integer"),  # an Arabic-Indic 3
        (["--limit", "1_000"], "--limit='1_000' is not an integer"),
        (["--after", "not-a-cursor"], "--after='not-a-cursor' is not a cursor"),
        (
            ["--after", _CURSOR[:-3]],
            "is not a cursor (give the one the previous page printed)",
        ),
        (  # a position no page printed, base64 by hand: no check of the search
            ["--after", _HAND_MADE],
            "is not a cursor (give the one the previous page printed)",
        ),
        (  # the case: a cursor of `--client C` given to `--event E`
            ["--event", str(uuid.uuid4()), "--after", _CURSOR],
            "is not a cursor of this search (another search printed it, or it was edited)",
        ),
        (  # the same filters but a bound moved: another search too
            ["--client", str(_CLIENT), "--due-from", "2026-01-01", "--after", _CURSOR],
            "is not a cursor of this search",
        ),
        (  # a position edited in a printed cursor: its check no longer holds
            ["--client", str(_CLIENT), "--after", _EDITED],
            "is not a cursor of this search",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_it(args, expected, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/never")
    assert main(["reminders", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("reminder-pipeline: error: ") and expected in err
