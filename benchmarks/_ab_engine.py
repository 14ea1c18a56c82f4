"""A/B of make_engine's two safety settings on the catch-up path (issue 16): the isolation level
pinned to READ COMMITTED and parameters hidden from errors, each on or off, alternating on
identical copies of one backlog; prints rows/s per round and the medians.

    .venv/bin/python -m benchmarks._ab_engine [ROWS] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url

from benchmarks._catchup import prepare_template
from benchmarks._infra import servers
from reminder_pipeline import cycle
from reminder_pipeline.messaging.kafka import KafkaPublisher, ensure_topic


def _variant(url: str, isolation: bool, hidden: bool) -> Engine:
    """make_engine's engine with or without the isolation level and hidden parameters."""
    extra: dict = {}
    if isolation:
        extra["isolation_level"] = "READ COMMITTED"
    if hidden:
        extra["hide_parameters"] = True
    return create_engine(
        make_url(url).set(drivername="postgresql+psycopg"),
        pool_size=5,
        max_overflow=5,
        pool_pre_ping=True,
        connect_args={
            "application_name": "ab",
            "connect_timeout": 10,
            "options": "-c client_connection_check_interval=5000"
            " -c idle_in_transaction_session_timeout=120000 -c TimeZone=UTC",
        },
        **extra,
    )


VARIANTS = {
    "both": (True, True),
    "isolation": (True, False),
    "hidden": (False, True),
    "neither": (False, False),
}


def main() -> None:
    """Print rows/s of each variant per round and the medians."""
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with servers() as srv:
        ensure_topic(srv.kafka)
        template = prepare_template(srv, "ab_tpl", rows)
        for i in range(rounds):
            order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                db = srv.create_database(f"ab_{variant}_{i}", template=template)
                url = srv.url(db)
                engine = _variant(url, *VARIANTS[variant])
                publisher = KafkaPublisher(srv.kafka)
                started = time.perf_counter()
                report = cycle.run_cycle(
                    engine, publisher, batch_size=1000, max_batches=10_000, budget_seconds=600
                )
                elapsed = time.perf_counter() - started
                publisher.close()
                engine.dispose()
                srv.drop_database(db)
                done = report.counts.sent + report.counts.skipped
                rates[variant].append(done / elapsed)
                print(
                    f"round {i} {variant:9} {done:,} rows {elapsed:5.1f}s {done / elapsed:,.0f} rows/s",
                    flush=True,
                )
    for variant, values in rates.items():
        print(
            f"{variant:9} median {statistics.median(values):,.0f} rows/s  {[round(v) for v in values]}"
        )


if __name__ == "__main__":
    main()
