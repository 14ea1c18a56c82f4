"""What an operator sees in the Dagster UI, checked in headless Chromium (Debian's package, no download).

Playwright for Python drives ``/usr/bin/chromium`` through ``executable_path``
(``reminder_pipeline_testkit.browser``); screenshots of each page go to the artifacts directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from reminder_pipeline_testkit.browser import CHROMIUM_FLAGS, chromium_path


def check_ui(base_url: str, artifacts: Path, *, timeout_ms: int = 60_000) -> list[Path]:
    """Job with a successful scheduled run, schedule running, asset with sent_count plotted."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=timeout_ms)

    shots: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(timeout_ms)

            def shot(name: str) -> None:
                path = artifacts / f"ui-{name}.png"
                page.screenshot(path=str(path), full_page=True)
                shots.append(path)

            # The job's runs: a successful run launched by the schedule.
            page.goto(f"{base_url}/locations/reminder_pipeline/jobs/reminder_dispatch/runs")
            expect(page.get_by_text("reminder_dispatch").first).to_be_visible()
            expect(page.get_by_text(re.compile(r"^Success$")).first).to_be_visible()
            expect(page.get_by_text("reminder_dispatch_schedule").first).to_be_visible()
            shot("job-runs")

            # The schedule: running, every minute.
            page.goto(
                f"{base_url}/locations/reminder_pipeline/schedules/reminder_dispatch_schedule"
            )
            expect(page.get_by_text("reminder_dispatch_schedule").first).to_be_visible()
            expect(page.get_by_role("row", name="Running").first).to_be_visible()
            expect(page.get_by_role("checkbox").first).to_be_checked()
            shot("schedule")

            # The dispatcher asset: its metadata plotted over time (Overview, Metadata, "Plots").
            page.goto(f"{base_url}/assets/calendar/reminder_dispatch")
            page.get_by_role("button", name=re.compile("Plots")).first.click()
            sent = page.get_by_text("sent_count", exact=True).first
            sent.scroll_into_view_if_needed()
            expect(sent).to_be_visible()
            expect(page.locator("canvas").first).to_be_visible()
            shot("asset-plots")
        finally:
            browser.close()
    return shots


def shoot_asset_checks(base_url: str, artifacts: Path, *, timeout_ms: int = 60_000) -> Path:
    """The dispatcher asset's Checks tab (every check listed), as ``ui-asset-checks.png``."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=timeout_ms)
    path = artifacts / "ui-asset-checks.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(timeout_ms)
            page.goto(f"{base_url}/assets/calendar/reminder_dispatch?view=checks")
            for name in ("dispatch_liveness", "lateness_slo", "clock_skew"):
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            page.screenshot(path=str(path))
        finally:
            browser.close()
    return path
