"""The project's single Dagster ``Definitions`` (``workspace.yaml`` loads ``reminder_pipeline.definitions:defs``).

Resources read ``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS`` through ``EnvVar``, resolved when
a run starts, so these definitions load (webserver, ``dagster definitions validate``, tests) with
no environment set.
"""

from dagster import Definitions, EnvVar

from .defs.assets import reminder_dispatch_asset
from .defs.jobs import reminder_catch_up, reminder_dispatch
from .defs.resources import KafkaResource, PostgresResource
from .defs.schedules import reminder_dispatch_schedule


def build_resources() -> dict:
    """The resources from the environment (the same variable names as the CLI)."""
    return {
        "postgres": PostgresResource(database_url=EnvVar("DATABASE_URL")),
        "kafka": KafkaResource(bootstrap_servers=EnvVar("KAFKA_BOOTSTRAP_SERVERS")),
    }


defs = Definitions(
    assets=[reminder_dispatch_asset],
    jobs=[reminder_dispatch, reminder_catch_up],
    schedules=[reminder_dispatch_schedule],
    resources=build_resources(),
)
