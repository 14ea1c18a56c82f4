"""Time-zone fallbacks in the metrics: each cycle's count reaches the ledger and the exporter.

A reminder whose event's zone is not a canonical IANA name goes out with ``"TimeZone": "UTC"``
and is counted in ``CycleCounts.time_zone_fallbacks``. Here cycles carrying such counts are
recorded the way the dispatcher records them, read back from ``dispatch_cycles`` and served as
``calendar_reminder_dispatch_time_zone_fallbacks_total`` by the real exporter, across a ledger
roll-up into ``dispatch_metric_totals`` (a counter never steps back).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from reminder_pipeline.domain.model import CycleCounts
from reminder_pipeline.observability import exporter as exp
from reminder_pipeline.observability import ledger
from reminder_pipeline.store.tables import dispatch_cycles, dispatch_metric_totals

from ..support import record_cycle_at
from .helpers import exporter_settings, scrape


def _cycle(engine, fallbacks: int, finished_at: datetime) -> None:
    counts = CycleCounts(sent=fallbacks + 1, time_zone_fallbacks=fallbacks)
    record_cycle_at(engine, "run-tz", counts, finished_at)


def test_build_record_carries_the_cycles_fallback_count():
    record = ledger.build_record("r", CycleCounts(sent=3, time_zone_fallbacks=2))
    assert record.time_zone_fallbacks == 2
    assert ledger.build_record("r", None).time_zone_fallbacks == 0


def test_fallbacks_are_counted_per_cycle_and_survive_a_roll_up(engine, database_url):
    now = datetime.now(UTC)
    _cycle(engine, 2, now - timedelta(minutes=2))
    _cycle(engine, 0, now - timedelta(minutes=1))
    _cycle(engine, 1, now)
    with engine.connect() as conn:
        stored = (
            conn.execute(
                sa.select(dispatch_cycles.c.time_zone_fallbacks).order_by(dispatch_cycles.c.id)
            )
            .scalars()
            .all()
        )
    assert stored == [2, 0, 1]

    settings, endpoints = exporter_settings(database_url)
    running = exp.start_exporter(settings, endpoints)
    try:
        before = scrape(running.url)
        assert before.value(exp.TIME_ZONE_FALLBACKS_COUNTER) == 3
        assert (
            before.families[exp.TIME_ZONE_FALLBACKS_COUNTER.removesuffix("_total")].type
            == "counter"
        )

        assert ledger.roll_up(engine, retention=timedelta(0)) == 3
        with engine.connect() as conn:
            left = conn.execute(sa.select(sa.func.count()).select_from(dispatch_cycles)).scalar()
            totals = conn.execute(sa.select(dispatch_metric_totals.c.time_zone_fallbacks)).scalar()
        assert (left, totals) == (0, 3)
        assert scrape(running.url).value(exp.TIME_ZONE_FALLBACKS_COUNTER) == 3

        _cycle(engine, 4, now + timedelta(minutes=1))  # the next cycle adds to the rolled-up total
        assert scrape(running.url).value(exp.TIME_ZONE_FALLBACKS_COUNTER) == 7
    finally:
        running.stop()
