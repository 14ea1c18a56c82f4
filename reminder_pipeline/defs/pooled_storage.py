"""Dagster's PostgreSQL storage on pooled connections, for the local stack's instance.

dagster-postgres opens a new connection for every storage call (SQLAlchemy's ``NullPool``), except
in ``dagster-webserver``, which calls ``optimize_for_webserver`` on its instance to keep one
connection per storage and open more only while calls overlap. An idle ``reminder-pipeline up``
made about 420 new connections a minute that way (the daemon's loops ~290, the code server and a
dispatch run's ~44 event-log writes the rest), each a PostgreSQL backend started and ended: the
largest part of the stack's CPU after the run worker (docs/benchmarks.md, "The local stack at the
demo's load").

These classes are dagster-postgres's storages, with the same config, for the ``run_storage`` /
``event_log_storage`` / ``schedule_storage`` keys of an instance config; each calls that public
method on itself once built, so every process that loads the instance (daemon, code server, run
workers; the webserver does it again itself) keeps its connections.
`reminder-pipeline up` writes them into the instance it prepares
(:func:`reminder_pipeline.local.dagster_processes.pooled_instance_config`); the shipped instance
(``dagster_instance.yaml``, the image) keeps dagster-postgres's default.

What a pool changes: a connection outlives a PostgreSQL restart in the pool, so the first call of
each storage after a restart fails (SQLAlchemy then drops the pool's connections) and the next one
reconnects, where a new connection per call would have failed only while the server was down.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

from ..store.engine import DAGSTER_STATEMENT_TIMEOUT_MS

#: As ``dagster-webserver`` pools (its ``--db-pool-recycle`` / ``--db-pool-max-overflow``
#: defaults): one connection kept per storage, recycled after an hour; up to 20 more opened
#: while calls overlap (a daemon runs several loops at once), closed when returned.
POOL_RECYCLE_SECONDS = 3600
POOL_MAX_OVERFLOW = 20


def _arguments(inst_data: Any, config_value: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's arguments, as dagster-postgres's ``from_config_value`` builds them."""
    return {
        "inst_data": inst_data,
        "postgres_url": pg_url_from_config(config_value),
        "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
        "token_provider": get_token_provider_from_config(config_value),
    }


def _pool(storage: PostgresRunStorage | PostgresEventLogStorage | PostgresScheduleStorage) -> None:
    storage.optimize_for_webserver(
        statement_timeout=DAGSTER_STATEMENT_TIMEOUT_MS,
        pool_recycle=POOL_RECYCLE_SECONDS,
        max_overflow=POOL_MAX_OVERFLOW,
    )


class PooledPostgresRunStorage(PostgresRunStorage):
    """``PostgresRunStorage`` on pooled connections (config: the same as dagster-postgres's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _pool(self)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> Self:
        return cls(**_arguments(inst_data, config_value))


class PooledPostgresEventLogStorage(PostgresEventLogStorage):
    """``PostgresEventLogStorage`` on pooled connections."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _pool(self)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> Self:
        return cls(**_arguments(inst_data, config_value))


class PooledPostgresScheduleStorage(PostgresScheduleStorage):
    """``PostgresScheduleStorage`` on pooled connections."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _pool(self)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> Self:
        return cls(**_arguments(inst_data, config_value))
