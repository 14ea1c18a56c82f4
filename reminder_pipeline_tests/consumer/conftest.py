"""Fixtures of the consumer tests: a private lane (topics, group, dedup file) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reminder_pipeline.config import KafkaSettings
from reminder_pipeline_testkit.dedup_store import dedup_database

from .lane import Lane, new_lane


@pytest.fixture
def lane(kafka_settings: KafkaSettings, tmp_path: Path) -> Lane:
    """Topics, a dead-letter topic and a consumer group of this test's own."""
    return new_lane(kafka_settings, tmp_path)


@pytest.fixture
def shared_dedup_url(pg_admin_url: str) -> Iterator[str]:
    """The shared de-dup store on the session's server, as compose makes it
    (:func:`reminder_pipeline_testkit.dedup_store.dedup_database`: the initdb role script, a login
    of its own)."""
    with dedup_database(pg_admin_url) as url:
        yield url
