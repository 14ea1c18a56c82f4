"""Fixtures of the fault tests: a fault proxy in front of the session's PostgreSQL.

The proxy is :class:`reminder_pipeline_testkit.fault_proxy.FaultProxy` (plain asyncio on a daemon
thread); packet drops, which a proxy cannot make, are in :mod:`reminder_pipeline_testkit.netns`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from reminder_pipeline_testkit.fault_proxy import FaultProxy, pg_url_via


def psycopg_dsn(url: str) -> str:
    """A libpq connection URI of an SQLAlchemy URL (for psycopg.connect)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def pg_proxy(pg_admin_url: str) -> Iterator[FaultProxy]:
    """A FaultProxy(postgres=True) in front of the session's PostgreSQL; passing, closed after."""
    url = make_url(pg_admin_url)
    proxy = FaultProxy(url.port or 5432, target_host=url.host or "127.0.0.1", postgres=True).start()
    try:
        yield proxy
    finally:
        # Back to pass first: the connections a stuck mode held reach the server's close too.
        proxy.set_mode("pass")
        proxy.close()


@pytest.fixture
def database_url_via_proxy(database_url: str, pg_proxy: FaultProxy) -> str:
    """The test's fresh database (``database_url``), reached through ``pg_proxy``."""
    return pg_url_via(database_url, pg_proxy)
