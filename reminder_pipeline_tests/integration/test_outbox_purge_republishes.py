"""The outbox purge takes its rows' re-publish records with them (issue 35), in the real database.

A published row past the retention with two recorded re-publishes, a recent one with one: the
purge deletes the old row and its two records, and keeps the recent row and its record.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from reminder_pipeline.operator_jobs.outbox_retention import purge_published
from reminder_pipeline.store.tables import outbox, outbox_republishes

from ..support import utcnow


def _published(engine: sa.Engine, hours_ago: float, copies: int) -> int:
    with engine.begin() as conn:
        outbox_id = conn.execute(
            sa.insert(outbox)
            .values(
                topic="t",
                message_key="k",
                payload={},
                reminder_id=uuid.uuid4(),
                published_at=utcnow() - timedelta(hours=hours_ago),
            )
            .returning(outbox.c.id)
        ).scalar_one()
        for offset in range(copies):
            conn.execute(
                sa.insert(outbox_republishes).values(
                    outbox_id=outbox_id, run_id="run", kafka_partition=0, kafka_offset=offset
                )
            )
    return int(outbox_id)


def test_the_purge_deletes_the_re_publish_records_of_the_rows_it_purges(engine: sa.Engine) -> None:
    old = _published(engine, hours_ago=3, copies=2)
    recent = _published(engine, hours_ago=0.5, copies=1)

    assert purge_published(engine, timedelta(hours=1), operator="test") == 1

    with engine.connect() as conn:
        assert conn.execute(sa.select(outbox.c.id)).scalars().all() == [recent]
        kept = conn.execute(sa.select(outbox_republishes.c.outbox_id)).scalars().all()
    assert kept == [recent] and old not in kept
