"""Fixtures of the consumer tests: a private lane (topics, group, dedup file) per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from reminder_pipeline.config import KafkaSettings

from .lane import Lane, new_lane


@pytest.fixture
def lane(kafka_settings: KafkaSettings, tmp_path: Path) -> Lane:
    """Topics, a dead-letter topic and a consumer group of this test's own."""
    return new_lane(kafka_settings, tmp_path)
