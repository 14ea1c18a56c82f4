"""Reminders as short Markdown cards for a run's metadata (the trace and find jobs).

One card per trace item (:mod:`reminder_pipeline.operator_jobs.trace`): a heading with the
reminder id and its status, then its fields down the page, the run as a link to its page in the
Dagster UI when it has one (a cycle run from the CLI has none: its id stays plain text), the
reason in words and every re-publish as a sub-item. A wide table of twenty columns wraps
character by character in the UI; a card reads top to bottom. Values are escaped, so an id or an
error text never turns into Markdown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: The fields shown after the heading, in this order, with their labels. ``run_id`` is the run
#: link; ``republishes`` the sub-items. Other keys an item carries follow under their own name.
_LABELS = (
    ("event_id", "Event"),
    ("kind", "Kind"),
    ("owner_user_id", "Owner"),
    ("client_user_id", "Client"),
    ("tenant_id", "Tenant"),
    ("due_at", "Due at"),
    ("sent_at", "Sent at"),
    ("reason", "Why"),
    ("run_id", "Run"),
    ("published_at", "Published at"),
    ("partition", "Partition"),
    ("offset", "Offset"),
    ("failed_publish_attempts", "Failed publish attempts"),
    ("publish_attempts", "Failed publish attempts"),
    ("attempts", "Dispatch attempts"),
    ("moved_by", "Moved by"),
    ("event_status", "Event status"),
    ("outbox_id", "Outbox row"),
    ("delivered", "Delivered"),
)
#: Keys that are not shown as a field of their own (in the heading, a link or the sub-items).
_NOT_FIELDS = frozenset({"reminder_id", "status", "run_url", "republishes"})

# The characters that can start emphasis, code, a link, HTML, an entity, a heading's closing
# sequence or a table cell anywhere in a line (a value never starts a line, so ``-``, ``+`` and
# ``.`` stay as they are: ids and times read verbatim).
_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&])")


def escape(value: Any) -> str:
    """A value as Markdown text that renders as itself, on one line."""
    text = " ".join(str(value).split())
    return _SPECIAL.sub(r"\\\1", text)


def _url(url: str) -> str:
    """A link target with nothing that could end it early."""
    return "".join(f"%{ord(c):02X}" if c in " ()<>[]\"'\\" else c for c in url)


def _link(text: Any, url: Any) -> str:
    """``[text](url)`` when there is a URL, the plain escaped text when not."""
    return f"[{escape(text)}]({_url(str(url))})" if url else escape(text)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return escape(value)


def _card(item: Mapping[str, Any]) -> list[str]:
    status = item.get("status")
    heading = f"### Reminder {escape(item.get('reminder_id', '?'))}"
    lines = [heading + (f" · {escape(status)}" if status else ""), ""]
    shown: set[str] = set()
    for key, label in _LABELS:
        value = item.get(key)
        if value is None or label in shown:
            continue
        shown.add(label)
        if key == "run_id":
            lines.append(f"- **{label}:** {_link(value, item.get('run_url'))}")
        else:
            lines.append(f"- **{label}:** {_value(value)}")
    known = {key for key, _ in _LABELS} | _NOT_FIELDS
    for key, value in item.items():
        if key not in known and value is not None and not isinstance(value, (list, dict)):
            lines.append(f"- **{escape(key)}:** {_value(value)}")
    copies = item.get("republishes") or []
    if copies:
        lines.append(f"- **Re-publishes:** {len(copies)}")
        for c in copies:
            run = _link(c.get("run_id") or "no run", c.get("run_url"))
            lines.append(
                f"    - {_value(c.get('republished_at'))} by run {run}, partition "
                f"{_value(c.get('partition'))}, offset {_value(c.get('offset'))}"
            )
    return [*lines, ""]


def reminder_cards(items: list[dict[str, Any]], *, title: str | None = None) -> str:
    """The items as Markdown: an optional ``## title``, then one short card per reminder."""
    lines = [f"## {escape(title)}", ""] if title else []
    if not items:
        lines.append("No reminders.")
    for item in items:
        lines.extend(_card(item))
    return "\n".join(lines).rstrip() + "\n"
