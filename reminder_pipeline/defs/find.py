"""``reminder_find``: support's finder from the Launchpad, the filters as run config.

The same plain call as ``reminder-pipeline reminders`` (:mod:`reminder_pipeline.operator_jobs.
finder`), with the same checks (a bad value refuses the run in one line before it exists). The
run shows each reminder as a short card (Markdown metadata), the count and the next page's
cursor, and logs one line per reminder (ids only). Read-only, so it never waits for the dispatch
limit.
"""

# No ``from __future__ import annotations``: Dagster reads the ops' and fields' annotations.

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Any, Optional

from dagster import (
    Config,
    MetadataValue,
    OpExecutionContext,
    Output,
    in_process_executor,
    job,
    op,
)
from pydantic import Field, model_validator

from ..config import Settings, parse_range_end, parse_range_start
from ..operator_jobs import finder
from .cards import reminder_cards
from .jobs import KIND_TAG
from .resources import PostgresResource
from .run_config import checked_by, validated

FIND_JOB_NAME = "reminder_find"


def _text(check: Callable[[Any, str], Any], name: str) -> Callable[[Any], Optional[str]]:
    """``check`` on a text field; the field keeps the canonical text (blank: not given)."""

    def checked(value: Any) -> Optional[str]:
        if isinstance(value, str) and not value.strip():
            return None
        result = check(value, name)
        return str(result) if isinstance(result, str | uuid.UUID) else str(value).strip()

    return checked


def _statuses(value: Any) -> list[str]:
    values = [value] if isinstance(value, str) else list(value)
    return list(dict.fromkeys(finder.check_status(v, "status") for v in values if str(v).strip()))


class FindConfig(Config):
    """Which reminders: every filter given holds (none: every reminder), newest due first."""

    owner: Annotated[Optional[str], checked_by(_text(finder.check_id, "owner"))] = Field(
        default=None, description="The owner's user id: reminders of their events."
    )
    client: Annotated[Optional[str], checked_by(_text(finder.check_id, "client"))] = Field(
        default=None, description="The client's user id: reminders of events with them."
    )
    tenant: Annotated[Optional[str], checked_by(_text(finder.check_id, "tenant"))] = Field(
        default=None, description="The tenant's id."
    )
    event: Annotated[Optional[str], checked_by(_text(finder.check_id, "event"))] = Field(
        default=None, description="An EventId: that event's reminders."
    )
    status: Annotated[list[str], checked_by(_statuses)] = Field(
        default=[], description="Pending, Sent, Skipped: any of these (empty: any status)."
    )
    kind: Annotated[Optional[str], checked_by(_text(finder.check_kind, "kind"))] = Field(
        default=None,
        description="The event's Kind: Showing, Consultation, Meeting, Task or BookingDeadline.",
    )
    due_from: Annotated[Optional[str], checked_by(_text(parse_range_start, "due_from"))] = Field(
        default=None,
        description="Due at or after: ISO-8601 with a zone, or a day alone (its 00:00 UTC).",
    )
    due_to: Annotated[Optional[str], checked_by(_text(parse_range_end, "due_to"))] = Field(
        default=None,
        description="Due at or before: ISO-8601 with a zone, or a day alone (the whole UTC day).",
    )
    limit: Annotated[int, checked_by(finder.check_limit)] = Field(
        default=finder.DEFAULT_FIND_LIMIT, description="Reminders per page, 1..1,000."
    )
    after: Annotated[Optional[str], checked_by(_text(finder.check_cursor_form, "after"))] = Field(
        default=None,
        description="The page after this cursor (the previous run's next_cursor, with the same "
        "filters: another search's is refused).",
    )

    def filters(self) -> finder.Filters:
        """The filters as the finder takes them."""
        due_from, due_before = finder.due_range(self.due_from, self.due_to)
        return finder.Filters(
            owner=None if self.owner is None else finder.check_id(self.owner, "owner"),
            client=None if self.client is None else finder.check_id(self.client, "client"),
            tenant=None if self.tenant is None else finder.check_id(self.tenant, "tenant"),
            event=None if self.event is None else finder.check_id(self.event, "event"),
            statuses=tuple(self.status),
            kind=self.kind,
            due_from=due_from,
            due_before=due_before,
        )

    def position(self) -> Optional[tuple[datetime, uuid.UUID]]:
        """The page's start: ``after`` checked against this very search (None: the first)."""
        filters = self.filters()
        return None if self.after is None else finder.decode_cursor(self.after, filters)

    @model_validator(mode="after")
    def _a_possible_search(self) -> "FindConfig":
        # due_from after due_to, a cursor of another search: the finder's one-line refusals.
        self.position()
        return self


@op(description="The reminders the filters take, newest due first, each with why it is so.")
def find_reminders(
    context: OpExecutionContext, config: FindConfig, postgres: PostgresResource
) -> Iterator[Output[dict[str, Any]]]:
    """A page of reminders as the output, cards in its metadata, a log line per reminder."""
    items, following = finder.find(
        postgres.engine,
        config.filters(),
        limit=config.limit,
        after=config.position(),
        ui_url=Settings.from_env().dagster_ui_url,
    )
    for item in items:
        context.log.info(
            f"reminder {item['reminder_id']} event={item['event_id']} status={item['status']}"
        )
    title = f"{len(items)} reminder(s), newest due first" + ("; more follow" if following else "")
    yield Output(
        {"reminders": items, "next": following},
        metadata={
            "count": len(items),
            "next_cursor": following or "none: the last page",
            "reminders": MetadataValue.md(reminder_cards(items, title=title)),
        },
    )


@job(
    name=FIND_JOB_NAME,
    description="Find reminders by who and when: owner, client, tenant (ids), event, status "
    "(a list), kind, due_from / due_to (ISO-8601; a day alone is that UTC day), newest due "
    "first, limit per page, after (the previous run's next_cursor). Each reminder as a card.",
    config=validated(FIND_JOB_NAME, FindConfig, find_reminders),
    executor_def=in_process_executor,
    tags={KIND_TAG: "operator", "dagster/max_runtime": "60"},
)
def reminder_find() -> None:
    """One step: the finder."""
    find_reminders()
