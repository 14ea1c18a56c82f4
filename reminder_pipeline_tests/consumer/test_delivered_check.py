"""A trace's delivered check only reads the consumers' de-duplication store (issue 35).

Against real stores: the shared PostgreSQL one through a login granted SELECT alone (a 40-day-old
entry, past the consumers' retention, survives the look-up: no prune, and nothing is created),
and SQLite files: a store answers, while a file that is not a store (a text file, an empty file)
or a missing one is one line and is left exactly as it was.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from reminder_pipeline.consumer.dedup import HANDLED, DedupStoreError, SqliteDedupStore
from reminder_pipeline.consumer.delivered import delivered_check

from ..support import error_lines, run_cli


def _dsn(url: str, **changes: str) -> str:
    return (
        make_url(url).set(drivername="postgresql", **changes).render_as_string(hide_password=False)
    )


@pytest.fixture
def select_only_url(shared_dedup_url: str, pg_admin_url: str) -> Iterator[str]:
    """A login of the shared store's database that may only SELECT from reminder_dedup."""
    store = make_url(shared_dedup_url)
    login, password = f"rp_dedup_reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = _dsn(pg_admin_url, database=str(store.database))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE \"{login}\" LOGIN PASSWORD '{password}'")
        conn.execute(f'GRANT CONNECT ON DATABASE "{store.database}" TO "{login}"')
        conn.execute(f'GRANT USAGE ON SCHEMA public TO "{login}"')
        conn.execute(f'GRANT SELECT ON reminder_dedup TO "{login}"')
    try:
        yield store.set(username=login, password=password).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{login}"')
        with psycopg.connect(_dsn(pg_admin_url), autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{login}"')


def test_a_select_only_login_reads_the_shared_store_and_prunes_nothing(
    shared_dedup_url: str, select_only_url: str
) -> None:
    old, recent = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(_dsn(shared_dedup_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO reminder_dedup (reminder_id, recipient_user_id, other_id, recorded_at) "
            "VALUES (%s, %s, %s, now() - interval '40 days'), (%s, %s, %s, now())",
            (old, HANDLED, uuid.uuid4(), recent, HANDLED, uuid.uuid4()),
        )

    with delivered_check(select_only_url, None) as delivered:
        assert delivered is not None
        assert delivered(old) and delivered(recent) and not delivered(uuid.uuid4())

    with psycopg.connect(_dsn(shared_dedup_url), autocommit=True) as conn:
        kept = conn.execute(
            "SELECT count(*) FROM reminder_dedup WHERE reminder_id = ANY(%s)", ([old, recent],)
        ).fetchone()
    assert kept == (2,)  # the 40-day-old entry survived the look-up


def test_a_store_file_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite3"
    handled = uuid.uuid4()
    with SqliteDedupStore(path) as store:
        store.mark_handled(handled, uuid.uuid4())
        store.mark_handled(old := uuid.uuid4(), uuid.uuid4())
    with sqlite3.connect(path) as conn:  # an entry far past the retention
        conn.execute(
            "UPDATE reminders SET handled_at = '2000-01-01T00:00:00.000+00:00' "
            "WHERE reminder_id = ?",
            (str(old),),
        )
    with delivered_check(None, str(path)) as delivered:
        assert delivered is not None
        assert delivered(handled) and delivered(old) and not delivered(uuid.uuid4())
    with SqliteDedupStore(path, read_only=True) as store:
        assert store.counts() == (2, 0)


@pytest.mark.parametrize("content", [b"", b"root:x:0:0:root:/root:/bin/bash\n"])
def test_a_file_that_is_not_a_store_is_one_line_and_left_unchanged(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "not-a-store"
    path.write_bytes(content)
    with pytest.raises(DedupStoreError) as raised, delivered_check(None, str(path)):
        pass
    assert str(raised.value).startswith(f"--dedup-path: {path} is not the consumer's")
    assert "\n" not in str(raised.value)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-store"]


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with (
        pytest.raises(DedupStoreError, match="is not a file"),
        delivered_check(None, str(tmp_path / "nope.sqlite3")),
    ):
        pass
    assert list(tmp_path.iterdir()) == []


def test_trace_with_a_dedup_path_that_is_not_a_store_is_one_line(
    database_url: str, tmp_path: Path
) -> None:
    env = {"DATABASE_URL": database_url, "REMINDER_PIPELINE_HOME": str(tmp_path / "home")}
    result = run_cli("trace", str(uuid.uuid4()), "--dedup-path", "/etc/passwd", env=env)
    assert result.returncode == 1
    assert error_lines(result) == [
        "reminder-pipeline: error: trace: --dedup-path: /etc/passwd is not the consumer's "
        "de-duplication store (file is not a database)"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("given", "shown"),
    [("not a url", "'not a url'"), ("mysql://u:s3cret@db/x", "'mysql://u:***@db/x'")],
)
def test_trace_with_a_dedup_url_that_is_not_one_names_the_value_as_given(
    tmp_path: Path, given: str, shown: str
) -> None:
    """The value given, its password masked (it said ``''``: the scheme it parsed), exit 2,
    before any server is reached."""
    env = {
        "DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/never",
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }
    result = run_cli("trace", str(uuid.uuid4()), "--dedup-url", given, env=env)
    assert result.returncode == 2
    assert error_lines(result) == [
        f"reminder-pipeline: error: --dedup-url: {shown} is not a postgresql:// URL with a host"
    ]
    assert not (tmp_path / "home").exists()
