"""The re-publish back-fill through the real daemon: two days picked as in the UI's back-fill dialog.

Webserver + daemon on a temporary ``DAGSTER_HOME`` (the schedule keeps dispatching meanwhile); the
daemon's sensor ``reminder_republish_days`` lists the days with sends as partitions.
The back-fill is launched with the GraphQL mutation the UI's dialog sends
(``launchPartitionBackfill`` on the job's partition set); the back-fill daemon launches one run
per day, the run queue lets one ``republish`` run go at a time, and the back-fill completes. Each
partition of ``calendar/reminder_due_republished`` records its day's count, and every message of
both days is on the topic again, once, stamped with its day's run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from reminder_pipeline.defs.republish import (
    REPUBLISH_ASSET_KEY,
    REPUBLISH_JOB_NAME,
    REPUBLISH_PARTITIONS_NAME,
)
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.operator_jobs.republish import HEADER_REPUBLISHED_BY_RUN
from reminder_pipeline_testkit.browser import CHROMIUM_FLAGS, chromium_path
from reminder_pipeline_tests.support import publish_two_days, utcnow, wait_for_republished

pytestmark = [pytest.mark.slow]

# The daemon's back-fill loop runs every 30 s: one pass to launch the runs, one to see them done.
BACKFILL_TIMEOUT = 300.0
TERMINAL = ("COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")

# As the UI's "Launch backfill" dialog on the job's Partitions tab sends it.
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""
BACKFILL_STATUS = """
query BackfillStatus($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill { status numPartitions }
    ... on Error { message }
  }
}
"""


def _wait_for_backfill(stack: orchestrator.DagsterStack, backfill_id: str) -> dict:
    deadline = time.monotonic() + BACKFILL_TIMEOUT
    while True:
        found = stack.graphql(BACKFILL_STATUS, {"backfillId": backfill_id})
        backfill = found["partitionBackfillOrError"]
        assert backfill["__typename"] == "PartitionBackfill", backfill
        if backfill["status"] in TERMINAL:
            return backfill
        assert stack.is_running(), orchestrator.log_tail(stack.log_file("daemon"))
        assert time.monotonic() < deadline, (
            f"back-fill {backfill_id} still {backfill['status']} after {BACKFILL_TIMEOUT:.0f}s; "
            f"daemon log: {orchestrator.log_tail(stack.log_file('daemon'), 10)}"
        )
        time.sleep(1.0)


def test_a_two_day_backfill_launched_as_from_the_ui_republishes_both_days(
    engine,
    database_url,
    publisher,
    kafka_settings,
    kafka_reader,
    dagster_storage_url,
    tmp_path: Path,
    artifacts_dir: Path,
    monkeypatch,
):
    # No unpublished row here: a scheduled cycle's relay would publish it during the test.
    days = publish_two_days(engine, publisher, utcnow(), with_unpublished=False)
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_storage_url,
    }
    home = tmp_path / "dagster_home"
    stack = orchestrator.DagsterStack(home, env, port=free_port())
    stack.start(timeout=180)
    try:
        monkeypatch.setenv("DAGSTER_PG_URL", dagster_storage_url)
        instance = DagsterInstance.from_config(str(home))
        partitions = [day.isoformat() for day in days.days]
        # The daemon's sensor lists the days that can be re-published (its first tick).
        deadline = time.monotonic() + 120
        while not set(partitions) <= set(
            instance.get_dynamic_partitions(REPUBLISH_PARTITIONS_NAME)
        ):
            assert time.monotonic() < deadline, "reminder_republish_days listed no day in 120 s"
            time.sleep(1.0)
        launched = stack.graphql(
            LAUNCH_BACKFILL,
            {
                "backfillParams": {
                    "selector": {
                        "partitionSetName": f"{REPUBLISH_JOB_NAME}_partition_set",
                        "repositorySelector": {
                            "repositoryName": "__repository__",
                            "repositoryLocationName": orchestrator.LOCATION_NAME,
                        },
                    },
                    "partitionNames": partitions,
                    "fromFailure": False,
                    "tags": [],
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        backfill = _wait_for_backfill(stack, backfill_id)
        assert backfill == {
            "__typename": "PartitionBackfill",
            "status": "COMPLETED_SUCCESS",
            "numPartitions": 2,
        }

        runs = sorted(
            instance.get_run_records(filters=RunsFilter(tags={"dagster/backfill": backfill_id})),
            key=lambda r: r.start_time,
        )
        assert [r.dagster_run.tags["dagster/partition"] for r in runs] == partitions  # in order
        assert {r.dagster_run.job_name for r in runs} == {REPUBLISH_JOB_NAME}
        assert all(r.dagster_run.status is DagsterRunStatus.SUCCESS for r in runs)
        assert runs[1].start_time >= runs[0].end_time  # one re-publish run at a time
        run_of_day = {r.dagster_run.tags["dagster/partition"]: r.dagster_run.run_id for r in runs}

        records = instance.fetch_materializations(REPUBLISH_ASSET_KEY, limit=10).records
        counts = {
            r.partition_key: r.asset_materialization.metadata["republished_count"].value
            for r in records
        }
        assert counts == {day.isoformat(): len(days.published[day]) for day in days.days}
        assert {r.run_id for r in records} == set(run_of_day.values())

        for day in days.days:
            sent = wait_for_republished(kafka_reader, days.published[day], len(days.published[day]))
            assert sorted(m.value["ReminderId"] for m in sent) == sorted(days.published[day])
            assert {m.headers[HEADER_REPUBLISHED_BY_RUN] for m in sent} == {
                run_of_day[day.isoformat()]
            }
        if chromium_path():  # where an operator does this: the job's Partitions tab
            shots = _backfill_dialog_in_the_ui(stack.url, artifacts_dir, partitions)
            assert all(p.stat().st_size > 10_000 for p in shots)
    finally:
        stack.stop()


def _backfill_dialog_in_the_ui(base_url: str, artifacts: Path, partitions: list[str]) -> list[Path]:
    """The job's Partitions tab opens the back-fill dialog, which takes the two days (not submitted)."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)
    shots: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(
                f"{base_url}/locations/{orchestrator.LOCATION_NAME}/jobs/"
                f"{REPUBLISH_JOB_NAME}/partitions"
            )
            launch = page.get_by_role("button", name=re.compile("Launch backfill"))
            expect(launch.first).to_be_visible()
            shots.append(artifacts / "ui-republish-partitions.png")
            page.screenshot(path=str(shots[-1]), full_page=True)
            launch.first.click()
            dialog = page.get_by_role("dialog").first
            expect(dialog).to_be_visible()
            # Days already re-published count as completed, which the dialog leaves out unless
            # asked: an operator sending them again ticks "Completed" (the README says so).
            dialog.get_by_text(re.compile(r"^Completed")).first.click()
            dialog.get_by_role("textbox").first.fill(", ".join(partitions))
            dialog.get_by_role("textbox").first.press("Enter")
            expect(dialog.get_by_role("button", name="Submit 2 runs")).to_be_enabled()
            shots.append(artifacts / "ui-republish-backfill-dialog.png")
            page.screenshot(path=str(shots[-1]), full_page=True)
        finally:
            browser.close()
    return shots
