"""What an old snapshot costs the dispatcher, as figures: the metric families the exporter serves
and the metadata of the ``vacuum_horizon`` check (docs/runbooks/reminder-dispatch.md, "An old
snapshot holds back vacuum"). Read from PostgreSQL's cumulative statistics and the list of who
holds back the xmin horizon (store/metrics_repository.py): nothing is scanned.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..store import metrics_repository
from .metric_names import (
    INDEX_ENTRIES_FETCHED,
    INDEX_ENTRIES_READ,
    INDEX_SCANS,
    INDEX_SIZE,
    OLDEST_SNAPSHOT_AGE,
    OLDEST_SNAPSHOT_HOLDER,
    OLDEST_SNAPSHOT_XMIN_AGE,
    TABLE_DEAD_ROWS_GAUGE,
    TABLE_LAST_VACUUM,
    TABLE_LIVE_ROWS,
)


def vacuum_families(
    horizon: metrics_repository.VacuumHorizon | None,
    index_reads: Sequence[metrics_repository.IndexReads],
    tables: Sequence[metrics_repository.TableDeadRows],
) -> list[Metric]:
    """Who holds back vacuum (the oldest holder only: one series), and what it costs the due scan
    and the relay, from PostgreSQL's cumulative statistics (nothing scanned)."""
    out: list[Metric] = [
        GaugeMetricFamily(
            OLDEST_SNAPSHOT_AGE,
            "How long the oldest snapshot in the database has held back vacuum (its xmin "
            "horizon): the oldest holder's transaction age where pg_stat_activity shows it, at "
            "least since the first metrics-ledger row written after its xmin; 0 if none.",
            value=0.0 if horizon is None else horizon.age_seconds,
        ),
        GaugeMetricFamily(
            OLDEST_SNAPSHOT_XMIN_AGE,
            "How many transactions old the database's xmin horizon is (age() of the oldest "
            "holder's xmin, shown for every role); 0 if none.",
            value=0 if horizon is None else horizon.xmin_age,
        ),
    ]
    oldest = None if horizon is None else horizon.oldest
    if oldest is not None:
        holder = GaugeMetricFamily(
            OLDEST_SNAPSHOT_HOLDER,
            "The oldest holder of the xmin horizon (a session, walsender, prepared transaction "
            "or replication slot; the last two name their gid or slot in application_name); "
            "empty labels are hidden (another role's, without pg_read_all_stats).",
            labels=["kind", "pid", "application_name", "client_addr", "state"],
        )
        holder.add_metric(
            [
                oldest.kind,
                "" if oldest.pid is None else str(oldest.pid),
                oldest.application_name or "",
                oldest.client_addr or "",
                oldest.state or "",
            ],
            1,
        )
        out.append(holder)
    scans = CounterMetricFamily(
        INDEX_SCANS, "Index scans started on the index (pg_stat_user_indexes).", labels=["index"]
    )
    read = CounterMetricFamily(
        INDEX_ENTRIES_READ,
        "Index entries its scans returned (idx_tup_read): rate over the scans' rate is entries "
        "read per scan.",
        labels=["index"],
    )
    fetched = CounterMetricFamily(
        INDEX_ENTRIES_FETCHED,
        "Live rows fetched through the index (idx_tup_fetch): entries read and not fetched are "
        "mostly dead ones a snapshot keeps, stepped over.",
        labels=["index"],
    )
    size = GaugeMetricFamily(INDEX_SIZE, "Size of the index on disk.", labels=["index"])
    for index in index_reads:
        scans.add_metric([index.index], index.scans)
        read.add_metric([index.index], index.entries_read)
        fetched.add_metric([index.index], index.entries_fetched)
        size.add_metric([index.index], index.size_bytes)
    live = GaugeMetricFamily(
        TABLE_LIVE_ROWS, "Live row versions (pg_stat_user_tables, estimated).", labels=["table"]
    )
    dead = GaugeMetricFamily(
        TABLE_DEAD_ROWS_GAUGE,
        "Dead row versions not yet removed by vacuum (estimated); they stay while a snapshot "
        "older than them is held.",
        labels=["table"],
    )
    vacuumed = GaugeMetricFamily(
        TABLE_LAST_VACUUM,
        "When VACUUM (by hand or autovacuum) last ran on the table; 0 if never since the "
        "statistics were reset.",
        labels=["table"],
    )
    for table in tables:
        live.add_metric([table.table], table.live_rows)
        dead.add_metric([table.table], table.dead_rows)
        at = table.last_vacuum_at
        vacuumed.add_metric([table.table], 0.0 if at is None else at.timestamp())
    return [*out, scans, read, fetched, size, live, dead, vacuumed]


#: The watched indexes as the vacuum_horizon check's metadata names them.
_INDEX_FIGURES = {
    metrics_repository.DUE_INDEX: "due_index",
    metrics_repository.UNPUBLISHED_INDEX: "unpublished_index",
}


def vacuum_cost_metadata(
    reads: Sequence[metrics_repository.IndexReads],
    tables: Sequence[metrics_repository.TableDeadRows],
) -> dict[str, Any]:
    """What the held horizon costs: the watched indexes' reads (cumulative since PostgreSQL's
    statistics were reset: the exporter's counters give them per second) and sizes, the watched
    tables' dead rows and last vacuum."""
    figures: dict[str, Any] = {}
    for index in reads:
        name = _INDEX_FIGURES.get(index.index, index.index)
        per_scan = index.entries_per_scan
        figures |= {
            f"{name}_scans": index.scans,
            f"{name}_entries_read": index.entries_read,
            f"{name}_entries_fetched": index.entries_fetched,
            f"{name}_entries_read_per_scan": None if per_scan is None else round(per_scan, 1),
            f"{name}_size_bytes": index.size_bytes,
        }
    for table in tables:
        at = table.last_vacuum_at
        figures |= {
            f"{table.table}_dead_rows": table.dead_rows,
            f"{table.table}_live_rows": table.live_rows,
            f"{table.table}_last_vacuum_at": None if at is None else at.isoformat(),
        }
    return figures


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


_HOLDER_FIELDS = (
    "oldest_snapshot_holder",
    "holder_kind",
    "holder_pid",
    "holder_application_name",
    "holder_client_addr",
    "holder_state",
    "holder_xact_start",
    "holder_query_start",
    "holder_xmin_age",
    "holder_age_seconds",
)


def holder_figures(horizon: metrics_repository.VacuumHorizon) -> dict[str, Any]:
    """The oldest holder of the xmin horizon, field by field (None: nothing holds it)."""
    h = horizon.oldest
    values = (
        (None,) * len(_HOLDER_FIELDS)
        if h is None
        else (
            h.describe(),
            h.kind,
            h.pid,
            h.application_name,
            h.client_addr,
            h.state,
            iso(h.xact_start),
            iso(h.query_start),
            h.xmin_age,
            None if h.age_seconds is None else round(h.age_seconds, 1),
        )
    )
    fields: dict[str, Any] = dict(zip(_HOLDER_FIELDS, values, strict=True))
    return {
        **fields,
        "horizon_held_by": iso(horizon.held_by),
        "holders_listed": len(horizon.holders),
    }
