"""The consumer's alert rules, their promtool tests, runbook links and dashboard panels.

The rules (docker/prometheus/rules/notifications-consumer.rules.yml) must pass ``promtool check``
and their unit tests, page on any dead letter and on latency over 1 minute, link an existing
runbook section, and, like the dashboard's consumer row, query only metrics the consumer serves.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from reminder_pipeline.consumer import metrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "docker" / "prometheus"
RULES = PROMETHEUS / "rules" / "notifications-consumer.rules.yml"
RULE_TESTS = PROMETHEUS / "tests" / "notifications-consumer.test.yml"
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "calendar-overview.json"
RUNBOOK = ROOT / "docs" / "runbooks" / "notifications-consumer.md"

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None,
    reason="promtool not installed (Debian: apt-get install prometheus; scripts/test installs it)",
)


def _alerts() -> dict[str, dict]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _metric_names(text: str) -> set[str]:
    return {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for name in re.findall(r"notifications_reminder_consumer_[a-z_]+", text)
    }


@needs_promtool
def test_promtool_accepts_the_rules_and_every_alert_fires_in_its_unit_tests() -> None:
    check = _run(promtool, "check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    result = _run(promtool, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        a["alertname"]
        for case in tests["tests"]
        for a in case.get("alert_rule_test", [])
        if a.get("exp_alerts")
    }
    assert fired == set(_alerts())


def test_there_is_an_alert_for_any_dead_letter_and_for_latency_over_a_minute() -> None:
    alerts = _alerts()
    dead = alerts["ReminderDeadLettered"]
    assert metrics.DEAD_LETTERS in dead["expr"] and "for" not in dead  # at once
    assert dead["labels"]["severity"] == "critical"
    latency = alerts["ReminderNotificationLatencyHigh"]
    assert metrics.MESSAGE_TO_NOTIFIED + "_bucket" in latency["expr"]
    assert latency["expr"].strip().endswith("> 60")


def test_every_alert_links_an_existing_runbook_section() -> None:
    headings = {
        re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", line.lstrip("#").strip().lower()))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for name, rule in _alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert (ROOT / path).resolve() == RUNBOOK, name
        assert anchor in headings, f"{name}: no section #{anchor} in {path}"


def test_the_rules_and_the_dashboard_query_only_what_the_consumer_serves() -> None:
    served = {name.removesuffix("_total") for name in metrics.METRIC_NAMES}
    used = _metric_names(RULES.read_text() + DASHBOARD.read_text())
    used = {name.removesuffix("_total") for name in used}
    assert used and used <= served, used - served


def test_the_dashboard_has_the_consumers_row_and_panels() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    [start] = [i for i in rows if panels[i]["title"] == "Notifications consumer"]
    end = next((i for i in rows if i > start), len(panels))
    titles = {p["title"]: p for p in panels[start + 1 : end]}
    for title in (
        "Dead letters (last 1 h)",
        "Held partitions",
        "Consumer messages per minute",
        "Notifications sent per minute",
        "Message → notified p50 / p95 (SLA 60 s)",
        "DueAt → notified p50 / p95 (SLO 120 s)",
        "Dead letters by reason",
    ):
        assert title in titles, title
    latency = titles["Message → notified p50 / p95 (SLA 60 s)"]["fieldConfig"]["defaults"]
    assert [s["value"] for s in latency["thresholds"]["steps"]] == [None, 60]
    assert len({p["id"] for p in panels}) == len(panels)


def test_a_held_partition_and_a_refused_dead_letter_page() -> None:
    """A held partition stops a third of all reminders: critical, like a refused dead letter."""
    alerts = _alerts()
    assert alerts["ReminderConsumerPartitionHeld"]["labels"]["severity"] == "critical"
    assert alerts["ReminderDeadLetterRefused"]["labels"]["severity"] == "critical"
    assert metrics.DEAD_LETTERS_REFUSED in alerts["ReminderDeadLetterRefused"]["expr"]
