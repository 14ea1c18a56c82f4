"""One ``reminder_dispatch`` run in a process of its own, started on a signal from the test.

``python -m reminder_pipeline_tests.defs.dispatch_run_worker DATABASE_URL BOOTSTRAP_SERVERS``
prints ``ready`` once Dagster is imported and the job is loaded, waits for a line on stdin,
executes the run (its own ephemeral instance, as a separate deployment would), and prints the
run's materialization metadata as one JSON line.
"""

from __future__ import annotations

import json
import sys

from dagster import DagsterInstance

from reminder_pipeline.defs.jobs import reminder_dispatch
from reminder_pipeline_tests.defs.helpers import metadata_values, resources_for


def main() -> int:
    database_url, servers = sys.argv[1:3]
    resources = resources_for(database_url, servers)
    instance = DagsterInstance.ephemeral()
    print("ready", flush=True)
    sys.stdin.readline()
    result = reminder_dispatch.execute_in_process(
        instance=instance, resources=resources, raise_on_error=False
    )
    [materialization] = result.asset_materializations_for_node("relay_outbox")
    values = metadata_values(materialization)
    print(
        json.dumps(
            {
                "success": result.success,
                **{k: v for k, v in values.items() if isinstance(v, int | float)},
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
