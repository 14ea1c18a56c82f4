"""The consumer's durable de-duplication store: a real SQLite file, reopened as after a restart."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from reminder_pipeline.consumer.dedup import DedupStoreError, SqliteDedupStore


def test_a_handled_reminder_is_remembered_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dedup.sqlite3"
    reminder, event = uuid.uuid4(), uuid.uuid4()
    with SqliteDedupStore(path) as store:
        assert not store.is_handled(reminder)
        store.mark_handled(reminder, event)
        store.mark_handled(reminder, event)  # a second mark is harmless
    with SqliteDedupStore(path) as store:
        assert store.is_handled(reminder)
        assert not store.is_handled(uuid.uuid4())
        assert store.counts() == (1, 0)


def test_deliveries_are_remembered_per_recipient(tmp_path: Path) -> None:
    reminder, owner, client = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with SqliteDedupStore(tmp_path / "d.sqlite3") as store:
        store.mark_delivered(reminder, owner, uuid.uuid4())
        assert store.is_delivered(reminder, owner)
        assert not store.is_delivered(reminder, client)
        assert not store.is_handled(reminder)


def test_two_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """Consumers of one host share the file: what one handled, the other skips."""
    path = tmp_path / "d.sqlite3"
    reminder = uuid.uuid4()
    with SqliteDedupStore(path) as first, SqliteDedupStore(path) as second:
        first.mark_handled(reminder, uuid.uuid4())
        assert second.is_handled(reminder)


def test_prune_forgets_entries_older_than_the_retention(tmp_path: Path) -> None:
    with SqliteDedupStore(tmp_path / "d.sqlite3") as store:
        store.mark_handled(uuid.uuid4(), uuid.uuid4())
        store.mark_delivered(uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
        assert store.prune(timedelta(days=1)) == 0
        assert store.prune(timedelta(seconds=-1)) == 2
        assert store.counts() == (0, 0)


def test_a_file_from_a_newer_consumer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite3"
    SqliteDedupStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(DedupStoreError, match="newer"):
        SqliteDedupStore(path)
