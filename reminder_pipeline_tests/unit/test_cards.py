"""Reminders as Markdown cards (the trace and find jobs' metadata): no server."""

from __future__ import annotations

from reminder_pipeline.defs.cards import escape, reminder_cards

SENT = {
    "reminder_id": "11111111-1111-1111-1111-111111111111",
    "event_id": "22222222-2222-2222-2222-222222222222",
    "kind": "OneHourBefore",
    "status": "Sent",
    "due_at": "2026-12-02T09:00:00+00:00",
    "sent_at": "2026-12-02T09:00:05+00:00",
    "reason": "sent by run r1 at 2026-12-02T09:00:05+00:00; published at 2026-12-02T09:00:06+00:00",
    "run_id": "r1",
    "run_url": "http://ui.test:3000/runs/r1",
    "published_at": "2026-12-02T09:00:06+00:00",
    "partition": 3,
    "offset": 41,
    "failed_publish_attempts": 0,
    "attempts": 0,
    "event_status": "Planned",
    "outbox_id": 7,
    "republishes": [
        {
            "run_id": "r2",
            "run_url": "http://ui.test:3000/runs/r2",
            "republished_at": "2026-12-02T10:00:00+00:00",
            "partition": 3,
            "offset": 99,
        }
    ],
}


def test_a_card_has_a_heading_and_its_fields_down_the_page() -> None:
    text = reminder_cards([SENT], title="Trace")
    lines = text.splitlines()
    assert lines[0] == "## Trace"
    assert "### Reminder 11111111-1111-1111-1111-111111111111 · Sent" in lines
    assert "- **Event:** 22222222-2222-2222-2222-222222222222" in lines
    assert "- **Kind:** OneHourBefore" in lines
    assert "- **Due at:** 2026-12-02T09:00:00+00:00" in lines
    assert "- **Partition:** 3" in lines
    assert "- **Offset:** 41" in lines
    assert "- **Failed publish attempts:** 0" in lines
    assert any(line.startswith("- **Why:** sent by run r1 at") for line in lines)
    # one field per line, no table
    assert "|" not in text


def test_the_run_is_a_link_only_when_it_has_a_page() -> None:
    assert "- **Run:** [r1](http://ui.test:3000/runs/r1)" in reminder_cards([SENT])
    from_cli = {**SENT, "run_id": "corr-9", "run_url": None, "republishes": []}
    text = reminder_cards([from_cli])
    assert "- **Run:** corr-9" in text.splitlines()
    assert "](" not in text


def test_republishes_are_sub_items_with_their_links() -> None:
    lines = reminder_cards([SENT]).splitlines()
    assert "- **Re-publishes:** 1" in lines
    assert (
        "    - 2026-12-02T10:00:00+00:00 by run [r2](http://ui.test:3000/runs/r2), "
        "partition 3, offset 99"
    ) in lines


def test_the_old_field_name_and_a_partial_item_are_shown() -> None:
    old = {"reminder_id": "x", "status": "Pending", "publish_attempts": 2, "delivered": False}
    lines = reminder_cards([old]).splitlines()
    assert "- **Failed publish attempts:** 2" in lines
    assert "- **Delivered:** no" in lines
    found = {"reminder_id": "x", "status": "Skipped", "moved_by": "cli:up", "new_field": "y"}
    assert "- **Moved by:** cli:up" in reminder_cards([found]).splitlines()
    assert "- **new\\_field:** y" in reminder_cards([found]).splitlines()


def test_values_are_escaped_and_kept_on_one_line() -> None:
    assert escape("a*b_c [x](y) <b> #1 | `c` ~s~ &amp;\nnext") == (
        "a\\*b\\_c \\[x\\](y) \\<b\\> \\#1 \\| \\`c\\` \\~s\\~ \\&amp; next"
    )
    bad = {**SENT, "reason": "failed (last error: **boom** [click](http://evil))", "run_url": None}
    text = reminder_cards([bad])
    assert "**boom**" not in text
    assert "[click](http://evil)" not in text
    assert "\\*\\*boom\\*\\* \\[click\\](http://evil)" in text


def test_no_reminders_says_so() -> None:
    assert reminder_cards([], title="Found") == "## Found\n\nNo reminders.\n"
