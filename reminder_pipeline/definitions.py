"""The project's single Dagster ``Definitions`` (``workspace.yaml`` loads ``definitions:defs``).

Resources read ``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS`` through ``EnvVar``, resolved when
a run starts, so these definitions load (webserver, ``dagster definitions validate``, tests) with
no environment set.

What is in it: the dispatcher asset with its seven health checks; the jobs ``reminder_dispatch``,
``reminder_catch_up``, ``reminder_health_checks``, ``reminder_poison_rows``,
``outbox_retention``, ``reminder_trace`` (a reminder's or an event's trace),
``reminder_find`` (support's finder: reminders by who and when),
``reminder_republish`` (the re-publish back-fill, one partition per day that can be
re-published, with its asset ``calendar/reminder_due_republished``) and
``dagster_run_retention``; the schedules
``reminder_dispatch_schedule`` (every minute), ``outbox_retention_schedule`` and
``dagster_run_retention_schedule`` (daily); the sensors ``reminder_health_sensor`` (the checks,
every minute, no run), ``reminder_dispatch_failure_ledger`` and ``reminder_republish_days``
(the back-fill's days, every 5 minutes, no run).
"""

from dagster import Definitions, EnvVar

from .defs.assets import reminder_dispatch_asset
from .defs.checks import reminder_dispatch_health
from .defs.find import reminder_find
from .defs.jobs import (
    outbox_retention,
    reminder_catch_up,
    reminder_dispatch,
    reminder_health_checks,
    reminder_poison_rows,
)
from .defs.republish import reminder_due_republished, reminder_republish, reminder_republish_days
from .defs.resources import KafkaResource, PostgresResource
from .defs.run_retention import dagster_run_retention, dagster_run_retention_schedule
from .defs.schedules import outbox_retention_schedule, reminder_dispatch_schedule
from .defs.sensors import reminder_dispatch_failure_ledger, reminder_health_sensor
from .defs.trace import reminder_trace


def build_resources() -> dict[str, PostgresResource | KafkaResource]:
    """The resources from the environment (the same variable names as the CLI)."""
    return {
        "postgres": PostgresResource(database_url=EnvVar("DATABASE_URL")),
        "kafka": KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS")),
    }


defs = Definitions(
    assets=[reminder_dispatch_asset, reminder_due_republished],
    asset_checks=[reminder_dispatch_health],
    jobs=[
        reminder_dispatch,
        reminder_catch_up,
        reminder_health_checks,
        reminder_poison_rows,
        outbox_retention,
        reminder_republish,
        dagster_run_retention,
        reminder_trace,
        reminder_find,
    ],
    schedules=[
        reminder_dispatch_schedule,
        outbox_retention_schedule,
        dagster_run_retention_schedule,
    ],
    sensors=[reminder_health_sensor, reminder_dispatch_failure_ledger, reminder_republish_days],
    resources=build_resources(),
)
