"""The cycle's counters are defined once (``CycleCounts``' fields) and derived everywhere else."""

from __future__ import annotations

from dataclasses import fields

from reminder_pipeline.defs.assets import NUMERIC_METADATA
from reminder_pipeline.domain.model import (
    COUNTER_DESCRIPTIONS,
    COUNTERS,
    FIGURES,
    LEDGER_COUNTERS,
    TOTALED_COUNTERS,
    CycleCounts,
)
from reminder_pipeline.store import metrics_queries, tables
from reminder_pipeline.store.metrics_repository import CycleRecord, LedgerTotals


def test_every_counter_has_a_description_and_the_lists_derive_from_the_record():
    assert tuple(f.name for f in fields(CycleCounts) if f.metadata.get("counter")) == COUNTERS
    assert {"sent", "skipped", "skipped_locked", "failed", "published"} <= set(COUNTERS)
    assert all(COUNTER_DESCRIPTIONS[name].strip() for name in COUNTERS)
    assert set(TOTALED_COUNTERS) <= set(LEDGER_COUNTERS) <= set(COUNTERS)


def test_add_sums_every_counter_and_as_dict_and_figures_carry_each_one():
    first = CycleCounts(**{name: i + 1 for i, name in enumerate(COUNTERS)})
    second = CycleCounts(**{name: 10 * (i + 1) for i, name in enumerate(COUNTERS)})
    first.add(second)
    assert [getattr(first, n) for n in COUNTERS] == [11 * (i + 1) for i in range(len(COUNTERS))]
    assert set(COUNTERS) <= set(first.as_dict())
    assert first.figures() == {FIGURES[n]: getattr(first, n) for n in FIGURES}
    assert set(FIGURES.values()) <= set(NUMERIC_METADATA)


def test_the_ledger_has_a_column_and_a_statement_parameter_for_each_of_its_counters():
    cycles = tables.dispatch_cycles.c
    totals = tables.dispatch_metric_totals.c
    assert all(name in cycles for name in LEDGER_COUNTERS)
    assert all(name in totals for name in TOTALED_COUNTERS)
    assert all(f":{name}" in metrics_queries.INSERT_CYCLE.text for name in LEDGER_COUNTERS)
    assert all(f"sum({name})" in metrics_queries.SUM_DETAIL.text for name in TOTALED_COUNTERS)
    assert set(LEDGER_COUNTERS) <= {f.name for f in fields(CycleRecord)}
    assert set(TOTALED_COUNTERS) <= {f.name for f in fields(LedgerTotals)}
