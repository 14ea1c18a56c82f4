"""``consume``: the reference notifications consumer. Its options are all here, in one place, and
so is its exit code (the consumer raises; :func:`consume_main` decides)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from ..config import CONSUMER_DEDUP_PATH_ENV, CONSUMER_DEDUP_URL_ENV, CONSUMER_GROUP_ID_ENV
from .context import load_settings
from .exits import EXIT_OK, consume_exit
from .options import env_option, flag, port_option

if TYPE_CHECKING:
    from ..config import Settings


@click.command()
@env_option(
    "--group-id",
    default="notifications-reference",
    envvar=CONSUMER_GROUP_ID_ENV,
    help="Kafka consumer group.",
)
@env_option(
    "--dedup-path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar=CONSUMER_DEDUP_PATH_ENV,
    show_default="under REMINDER_PIPELINE_HOME",
    help="SQLite file of delivered ReminderIds (durable de-duplication, one host).",
)
@env_option(
    "--dedup-url",
    default=None,
    envvar=CONSUMER_DEDUP_URL_ENV,
    help="PostgreSQL URL of the de-duplication table shared by consumers on several hosts.",
)
@flag(
    "--once",
    envvar="REMINDER_CONSUMER_ONCE",
    help="Exit when the topic has been idle for a while.",
)
@port_option(
    "--metrics-port",
    envvar="REMINDER_CONSUMER_METRICS_PORT",
    show_default="no metrics endpoint",
    help="Serve the consumer's Prometheus metrics on this port.",
)
@env_option(
    "--locale",
    type=click.Choice(["en", "ru"]),
    default="en",
    envvar="REMINDER_CONSUMER_LOCALE",
    help="Language of the printed notifications.",
)
def consume(
    group_id: str,
    dedup_path: str | None,
    dedup_url: str | None,
    once: bool,
    metrics_port: int | None,
    locale: str,
) -> int:
    """Run the reference notifications consumer (one line per notification)."""
    from pathlib import Path

    from ..local.endpoints import embedded_broker, require_servers

    settings = load_settings()
    require_servers(settings, database=False)
    servers = settings.kafka_bootstrap_servers or embedded_broker(settings).start()
    return consume_main(
        settings,
        group_id=group_id,
        dedup_path=Path(dedup_path) if dedup_path else None,
        dedup_url=dedup_url or None,
        once=once,
        bootstrap_servers=servers,
        metrics_port=metrics_port,
        locale=locale,
    )


def consume_main(settings: Settings, **kwargs: Any) -> int:
    """Run the consumer (``run_consumer``'s arguments) and decide the exit code: 0 on a clean stop;
    an expected failure is one line on stderr and :func:`.exits.consume_exit`'s code (2 for a bad
    option or a metrics port that cannot be listened on, 1 for a server or store that failed)."""
    from .. import consumer

    try:
        consumer.run_consumer(settings, **kwargs)
    except Exception as error:  # mapped to a documented exit code, or re-raised
        decided = consume_exit(error)
        if decided is None:
            raise
        code, line = decided
        print(f"reminder-pipeline consume: {line}", file=sys.stderr)
        return code
    return EXIT_OK
