"""``db upgrade|current|downgrade``: schema migrations (Alembic), with the owner's DATABASE_URL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..config import ConfigError
from .context import database, operator_name
from .exits import EXIT_OK
from .options import json_option
from .output import print_json

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@click.group()
def db() -> None:
    """Schema migrations (Alembic). Run them with the schema owner's DATABASE_URL."""


def _revision_line(engine: Engine) -> dict[str, str | None]:
    from ..store import migrate

    return {"current": migrate.current_revision(engine), "head": migrate.head_revision()}


def _print_revision(data: dict[str, str | None], as_json: bool) -> None:
    if as_json:
        print_json(data)
    else:
        print(f"database at revision {data['current']} (head {data['head']})", flush=True)


@db.command("upgrade")
@json_option
def db_upgrade(as_json: bool) -> int:
    """Migrate the schema to this code's head (the owner role; the dispatcher never does)."""
    from ..store import migrate

    with database(schema=False) as engine:
        migrate.upgrade(engine)
        data = _revision_line(engine)
    _print_revision(data, as_json)
    return EXIT_OK


@db.command("current")
@json_option
def db_current(as_json: bool) -> int:
    """Show the schema's revision and this code's head (a look-up: it starts no server)."""
    with database(schema=False, start=False) as engine:
        data = _revision_line(engine)
    _print_revision(data, as_json)
    return EXIT_OK


# A relative revision (-1) is a REVISION, not an unknown option.
@db.command("downgrade", context_settings={"ignore_unknown_options": True})
@click.argument("revision")
@click.option(
    "--yes",
    is_flag=True,
    default=False,
    help="Confirm: a downgrade drops tables and columns with their data. No environment "
    "variable: it must be typed each time.",
)
def db_downgrade(revision: str, yes: bool) -> int:
    """Migrate the schema back to REVISION (a revision id, or `base` for nothing at all).

    Destructive: refused without --yes; logged with your OS user.
    """
    from ..audit import audited
    from ..store import migrate

    revision = revision.strip()
    if not revision:
        raise ConfigError("db downgrade needs a REVISION (see `reminder-pipeline db current`)")
    if not yes:
        raise ConfigError(
            f"db downgrade {revision} drops schema objects and their data: add --yes to confirm"
        )
    with database(schema=False) as engine:
        before = migrate.current_revision(engine)
        with audited(
            "schema downgrade",
            operator=operator_name(),
            action="db downgrade",
            from_revision=before,
            target=revision,
        ) as outcome:
            try:
                migrate.downgrade(engine, revision)
            except migrate.BadRevision as error:
                raise ConfigError(
                    f"db downgrade {revision}: {error} (revisions: `reminder-pipeline db current`,"
                    " or `base`)"
                ) from None
            data = _revision_line(engine)
            changed = data["current"] != before
            outcome.message = "schema downgraded" if changed else "schema unchanged"
            outcome.fields.update(to_revision=data["current"], changed=changed)
    if not changed:
        where = before or "no revision (empty database)"
        print(f"nothing to downgrade: the database is already at {where} ({revision})", flush=True)
        return EXIT_OK
    _print_revision(data, as_json=False)
    return EXIT_OK
