"""``consume``: the reference notifications consumer. Its options are all here, in one place."""

from __future__ import annotations

import click

from .context import load_settings
from .options import env_option, flag, port_option


@click.command()
@env_option(
    "--group-id",
    default="notifications-reference",
    envvar="REMINDER_CONSUMER_GROUP_ID",
    help="Kafka consumer group.",
)
@env_option(
    "--dedup-path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="REMINDER_CONSUMER_DEDUP_PATH",
    show_default="under REMINDER_PIPELINE_HOME",
    help="SQLite file of delivered ReminderIds (durable de-duplication, one host).",
)
@env_option(
    "--dedup-url",
    default=None,
    envvar="REMINDER_CONSUMER_DEDUP_URL",
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

    from ..consumer import consume_main
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
