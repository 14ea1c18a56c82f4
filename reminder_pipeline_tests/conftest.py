"""Real servers for the whole test session: one PostgreSQL and one broker, a template database per test.

``DATABASE_URL`` / ``KAFKA_BOOTSTRAP_SERVERS`` point the suite at existing servers (the URL's
role needs CREATEDB); otherwise embedded ones are started in a temporary directory on free
ports, so a developer's running system is never touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import Engine, make_url

from reminder_pipeline.cli.context import honour_stop_signals
from reminder_pipeline.config import KafkaSettings
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.local.servers import EmbeddedBroker, EmbeddedPostgres, free_port
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic
from reminder_pipeline.store import migrate
from reminder_pipeline.store.engine import make_engine

from .support import KafkaReader

#: The migrated template each test's database is copied from; one per xdist worker, so workers
#: sharing one server (``DATABASE_URL``) never drop each other's template.
TEMPLATE_DB = f"rp_test_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"

#: The session fixtures that start (or reach) a real server; a test using one is in the full tier.
SERVER_FIXTURES = {"pg_admin_url", "kafka_settings"}


#: The modules whose tests take minutes each, longest first (``--durations``, docs/testing.md):
#: a parallel run starts them before anything else, so none of them is left to end it alone.
LONGEST = (
    "benchmarks_smoke/test_soak.py",
    "e2e/test_first_ten_minutes.py",
    "e2e/test_daemon.py",
    "integration/test_finder_plans.py",
    "benchmarks_smoke/test_bench_smoke.py",
    "faults/test_failover.py",
    "benchmarks_smoke/test_consumer_bench_smoke.py",
    "packaging/test_plain_install.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that uses a server fixture ``server`` (a module that starts servers itself
    says so with ``pytestmark = pytest.mark.server``): the fast tier, ``scripts/test-fast``, is
    ``-m "not server and not slow and not soak"``.

    For the parallel run (``scripts/test``: pytest-xdist, ``--dist loadscope``, each module on one
    worker, its tests in order, as in a serial run): the modules with a ``slow`` test go first,
    the ones that take minutes (``LONGEST``) before them, so the long tests start while the
    short ones fill the other workers instead of ending the run alone.
    """
    slow_modules = set()
    for item in items:
        if set(getattr(item, "fixturenames", ())) & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if item.get_closest_marker("slow") is not None:
            slow_modules.add(item.nodeid.split("::")[0])
    longest = {f"reminder_pipeline_tests/{path}": rank for rank, path in enumerate(LONGEST)}

    def order(item: pytest.Item) -> tuple[bool, int]:
        module = item.nodeid.split("::")[0]
        return module not in slow_modules, longest.get(module, len(longest))

    items.sort(key=order)  # stable: each module's tests stay together and in their order


@pytest.fixture(autouse=True)
def _stop_signals_not_ignored() -> None:
    """No test hands SIGINT or SIGTERM *ignored* to the processes it starts.

    A session started as a shell's background job has SIGINT ignored, and every in-process
    Dagster run maps SIGTERM onto SIGINT's disposition: both would then be inherited ignored by
    every child (a stand-in dispatcher would outlive its SIGTERM). The session's own handlers
    are not inherited across exec, so restoring them makes a child's signals what a terminal
    gives, however the suite was started (what the command line does for itself).
    """
    honour_stop_signals()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL of a database on the test server from which databases can be created."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    # Not under pytest's own temporary root: another pytest session on the machine takes
    # group/other permissions off that root, and a server running as its own system user (as
    # root, the embedded server does) then PANICs on its own data directory.
    workdir = Path(tempfile.mkdtemp(prefix="rp-test-pg-"))
    server = EmbeddedPostgres(data_dir=workdir / "data", port=free_port())
    server.start()
    try:
        yield server.url("postgres")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _psycopg_dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url)
    if database:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> str:
    """A database migrated to head, copied for every test (CREATE DATABASE ... TEMPLATE)."""
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    url = make_url(pg_admin_url).set(database=TEMPLATE_DB).render_as_string(hide_password=False)
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def database_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database for one test."""
    name = f"rp_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_engine(pg_admin_url: str) -> Iterator[Engine]:
    """An engine on an empty database of its own (no revision: the test migrates it itself)."""
    name = f"rp_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(
        make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    )
    yield engine
    engine.dispose()
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on the test's own database."""
    engine = make_engine(database_url, pool_size=10)
    yield engine
    engine.dispose()


@pytest.fixture
def dagster_storage_url(pg_admin_url: str) -> Iterator[str]:
    """Dagster's own database on the test server (psycopg2, as dagster-postgres needs), dropped
    afterwards."""
    name = f"rp_dagster_{uuid.uuid4().hex[:10]}"
    yield orchestrator.ensure_database(pg_admin_url, name)
    with psycopg.connect(_psycopg_dsn(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def kafka_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSettings]:
    """Settings of the test broker, with the contract's topic created."""
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    broker = None
    if not servers:
        broker = EmbeddedBroker(state_dir=tmp_path_factory.mktemp("broker"), port=free_port())
        servers = broker.start()
    settings = KafkaSettings.from_env(os.environ, servers)
    ensure_topic(settings)
    try:
        yield settings
    finally:
        if broker is not None:
            broker.stop()


@pytest.fixture
def publisher(kafka_settings: KafkaSettings) -> Iterator[KafkaPublisher]:
    """An idempotent producer on the test broker."""
    publisher = KafkaPublisher(kafka_settings)
    yield publisher
    publisher.close()


@pytest.fixture
def kafka_reader(kafka_settings: KafkaSettings) -> Iterator[KafkaReader]:
    """Reads the contract topic back (all partitions, from the beginning)."""
    reader = KafkaReader(kafka_settings)
    yield reader
    reader.close()


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests leave files for people (screenshots)."""
    path = Path(os.environ.get("TEST_ARTIFACTS_DIR", "test-artifacts")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
