"""What support reads in the Dagster UI, in headless Chromium against a real webserver and daemon:
a ``reminder_trace`` run launched over GraphQL shows the reminder as a card (its fields one under
the other, the run that wrote it as a link), and the dispatcher asset's page links the schedule,
the jobs that record it and its runbook. Screenshots of both land in the artifacts directory.
"""

from __future__ import annotations

import re
import time
from itertools import pairwise
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

from reminder_pipeline.defs.assets import WRITING_JOBS
from reminder_pipeline.local import dagster_processes as orchestrator
from reminder_pipeline.local.servers import free_port
from reminder_pipeline.operator_jobs import trace as trace_lookup
from reminder_pipeline_testkit.browser import CHROMIUM_FLAGS, chromium_path
from reminder_pipeline_tests.support import make_due_event, reminders

pytestmark = [
    pytest.mark.slow,
    pytest.mark.server,
    # dagster_graphql's client still calls gql the old way; not ours to fix.
    pytest.mark.filterwarnings("ignore:Using variable_values:DeprecationWarning"),
]

DOCS = "https://docs.example.test/reminder-pipeline/docs/"
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
RUN_TIMEOUT = 120.0
BROWSER_TIMEOUT_MS = 60_000


def _finished(client: DagsterGraphQLClient, run_id: str) -> DagsterRunStatus:
    """The run's end status, polled (the queued coordinator starts it within seconds)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while (status := client.get_run_status(run_id)) not in FINISHED:
        assert time.monotonic() < deadline, f"run {run_id} still {status} after {RUN_TIMEOUT} s"
        time.sleep(0.5)
    return status


def test_a_trace_run_shows_a_card_and_the_asset_page_links_what_feeds_it(
    engine, database_url, kafka_settings, dagster_storage_url, tmp_path: Path, artifacts_dir: Path
):
    if not chromium_path():
        pytest.skip("no chromium (e2e/test_daemon.py::test_browser_is_there_in_ci fails in CI)")
    from playwright.sync_api import expect, sync_playwright

    event_id = make_due_event(engine, minutes_overdue=2)
    [row] = reminders(engine, event_id)
    port = free_port()
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "DAGSTER_PG_URL": dagster_storage_url,
        "DAGSTER_WEBSERVER_PORT": str(port),  # the links the code location and runs build
        "REMINDER_DOCS_BASE_URL": DOCS,
    }
    stack = orchestrator.DagsterStack(tmp_path / "dagster_home", env, port=port)
    stack.start(timeout=180)
    try:
        client = DagsterGraphQLClient(stack.host, port_number=stack.port)
        # A Dagster run sends the reminder (this one, or a scheduled one that got there first).
        assert _finished(client, client.submit_job_execution("reminder_dispatch")) is (
            DagsterRunStatus.SUCCESS
        )
        [item] = trace_lookup.trace(engine, row["id"], ui_url=stack.url)
        assert item["status"] == "Sent" and item["run_url"] == f"{stack.url}/runs/{item['run_id']}"
        trace_run = client.submit_job_execution("reminder_trace", run_config={"id": str(row["id"])})
        assert _finished(client, trace_run) is DagsterRunStatus.SUCCESS

        expect.set_options(timeout=BROWSER_TIMEOUT_MS)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                page.set_default_timeout(BROWSER_TIMEOUT_MS)

                # The trace run: its output's Markdown opens as a card.
                page.goto(f"{stack.url}/runs/{trace_run}")
                show = page.get_by_text("[Show Markdown]").first
                show.scroll_into_view_if_needed()
                show.click()
                dialog = page.get_by_role("dialog")
                heading = dialog.get_by_role("heading", name=f"Reminder {item['reminder_id']}")
                expect(heading).to_be_visible()
                expect(heading).to_contain_text("Sent")
                fields = dialog.locator("li")
                labels = ["Event:", "Kind:", "Due at:", "Sent at:", "Why:", "Run:", "Partition:"]
                boxes = []
                for label in labels:
                    field = fields.filter(has_text=re.compile("^" + re.escape(label))).first
                    expect(field).to_be_visible()
                    boxes.append(field.bounding_box())
                # Down the page: one field a line, each under the one before, all aligned.
                assert all(a["y"] + a["height"] <= b["y"] + 1 for a, b in pairwise(boxes))
                # Aligned: the same left edge, give or take a sub-pixel (258.5 rounds either way),
                # where a table's columns would sit a hundred pixels apart.
                lefts = [b["x"] for b in boxes]
                assert max(lefts) - min(lefts) <= 2, lefts
                expect(fields.filter(has_text="Event:").first).to_contain_text(str(event_id))
                expect(fields.filter(has_text="Why:").first).to_contain_text(item["reason"])
                link = dialog.locator(f'a[href="{item["run_url"]}"]')
                expect(link).to_have_text(item["run_id"])
                page.screenshot(path=str(artifacts_dir / "ui-trace-card.png"))

                # The dispatcher asset: the schedule, the jobs and the runbook as links, in its
                # description and again in its metadata.
                page.goto(f"{stack.url}/assets/calendar/reminder_dispatch")
                ui = f"{stack.url}/locations/reminder_pipeline"
                links = {
                    "schedule": f"{ui}/schedules/reminder_dispatch_schedule",
                    **{f"job {name}": f"{ui}/jobs/{name}" for name in WRITING_JOBS},
                    "runbook": f"{DOCS}runbooks/reminder-dispatch.md",
                }
                keys = page.get_by_placeholder("Filter metadata keys")
                for label, href in links.items():
                    anchors = page.locator(f'a[href="{href}"]')
                    keys.fill(label)  # the metadata row, the description's link above it
                    expect(anchors.nth(1)).to_be_visible()
                    expect(anchors.first).to_be_visible()
                keys.fill("job")  # the shot: the description's links and the jobs' rows
                page.get_by_text("Description", exact=True).first.scroll_into_view_if_needed()
                page.screenshot(path=str(artifacts_dir / "ui-asset-links.png"))

                # A check's runbook: a link under the docs base URL.
                page.goto(f"{stack.url}/assets/calendar/reminder_dispatch?view=checks")
                page.get_by_text("no_overdue_reminders", exact=True).first.click()
                runbook = f"{DOCS}runbooks/reminder-dispatch.md#overdue-pending-reminders"
                expect(page.locator(f'a[href="{runbook}"]').first).to_be_visible()
                page.screenshot(path=str(artifacts_dir / "ui-check-runbook.png"))
            finally:
                browser.close()
    finally:
        stack.stop()
    for name in ("ui-trace-card.png", "ui-asset-links.png", "ui-check-runbook.png"):
        assert (artifacts_dir / name).stat().st_size > 10_000
