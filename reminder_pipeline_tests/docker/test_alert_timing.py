"""The alert rules against the seed's minutes and the health checks' thresholds (file checks).

``promtool test rules`` (test_docker_files.py) proves when each alert fires; these checks make
that proof hold for production: the promtool tests evaluate as often as Prometheus evaluates the
group, the seed's thresholds carry no ``for:`` delay, every rule (alerts with two rules
included) has its severity, text and runbook section, and the numbers in the expressions are the
ones the Dagster checks use.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import yaml

from reminder_pipeline.observability import health
from reminder_pipeline.store import metrics_repository

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "docker" / "prometheus"
RULES = PROMETHEUS / "rules" / "reminder-dispatch.rules.yml"
TESTS = PROMETHEUS / "tests" / "reminder-dispatch.test.yml"
_DURATION = re.compile(r"^(\d+)([smh])$")


def _seconds(duration: str) -> float:
    """A Prometheus duration such as ``15s``, ``5m`` or ``1h`` in seconds."""
    match = _DURATION.match(duration)
    assert match, duration
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def _group() -> dict:
    [group] = yaml.safe_load(RULES.read_text())["groups"]
    return group


def _rules(alert: str) -> list[dict]:
    return [r for r in _group()["rules"] if r.get("alert") == alert]


def _threshold(expr: str) -> float:
    """The number an expression compares with ``>`` last."""
    return float(re.findall(r">\s*(\d+(?:\.\d+)?)", expr)[-1])


def test_promtool_tests_evaluate_the_rules_as_often_as_prometheus_does():
    group_interval = _seconds(_group()["interval"])
    assert group_interval <= 15, "an alert fires at most one evaluation after its threshold"
    tests = yaml.safe_load(TESTS.read_text())
    assert _seconds(tests["evaluation_interval"]) == group_interval


def test_the_seeds_five_minute_thresholds_fire_without_a_for_delay():
    [live, never] = _rules("ReminderDispatchNotLive")
    [overdue] = _rules("ReminderDispatchOverdue")
    [backlog] = _rules("ReminderOutboxBacklog")
    for rule in (live, overdue, backlog):
        assert "for" not in rule, rule["alert"]
    # Ages are read from a sample up to one scrape old: the rules add the sample's own age.
    for rule in (overdue, backlog):
        assert "time() - timestamp(" in rule["expr"], rule["alert"]
    # "Never succeeded" has no timestamp to measure from: it waits the 5 minutes itself.
    assert "absent(" in never["expr"] and _seconds(never["for"]) == health.LIVENESS_SECONDS


def test_the_rules_thresholds_are_the_health_checks():
    [live, _] = _rules("ReminderDispatchNotLive")
    assert _threshold(live["expr"]) == health.LIVENESS_SECONDS
    [overdue] = _rules("ReminderDispatchOverdue")
    assert _threshold(overdue["expr"]) == health.OVERDUE_SECONDS
    [backlog] = _rules("ReminderOutboxBacklog")
    assert _threshold(backlog["expr"]) == health.OUTBOX_LAG_SECONDS

    [held_back, rate] = _rules("ReminderDispatchErrors")
    assert "calendar_reminder_dispatch_poison_rows" in held_back["expr"] and "for" not in held_back
    minimum = f"{metrics_repository.POISON_MIN_ATTEMPTS} or more failed attempts"
    assert minimum in held_back["annotations"]["description"]
    assert timedelta(seconds=_seconds(rate["for"])) == health.ERRORS_WINDOW
    [window] = re.findall(r"errors_total\[(\w+)\]", rate["expr"])
    assert timedelta(seconds=_seconds(window)) == health.ERRORS_GAP
    # One alert per label set: the rate rule leaves kind="item" to the gauge rule while it fires.
    assert "unless on (kind)" in rate["expr"]


def test_every_rule_has_severity_text_and_an_existing_runbook_section():
    rules = [r for r in _group()["rules"] if "alert" in r]
    assert len(rules) > len({r["alert"] for r in rules})  # some alerts have two rules
    seen = set()
    for rule in rules:
        labels = rule["labels"]
        assert labels["severity"] in ("critical", "warning"), rule["alert"]
        assert labels["service"] == "calendar", rule["alert"]
        # promtool lints rules with the same name and labels as duplicates.
        key = (rule["alert"], tuple(sorted(labels.items())))
        assert key not in seen, key
        seen.add(key)
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        path, _, anchor = annotations["runbook_url"].partition("#")
        text = (ROOT / path).read_text()
        anchors = {
            re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", line.lstrip("#").strip().lower()))
            for line in text.splitlines()
            if line.startswith("#")
        }
        assert not anchor or anchor in anchors, f"{rule['alert']}: no #{anchor} in {path}"
        assert f"`{rule['alert']}`" in text, f"{path} does not name {rule['alert']}"


def test_the_old_snapshot_rule_is_the_vacuum_horizon_check():
    [rule] = _rules("ReminderDispatchVacuumHeldBack")
    expr = rule["expr"]
    [age] = re.findall(r"oldest_snapshot_age_seconds\)\s*>\s*(\d+(?:\.\d+)?)", expr)
    assert float(age) == health.SNAPSHOT_OLD_SECONDS
    [factor] = re.findall(r">\s*(\d+(?:\.\d+)?)\s*\*\s*histogram_quantile", expr)
    assert float(factor) == health.SLOWING_FACTOR
    # The medians of the same histogram over the check's two windows: recent first, then baseline.
    assert expr.count("histogram_quantile(0.5,") == 2
    windows = re.findall(r"cycle_duration_seconds_bucket\[(\w+)\]", expr)
    assert [timedelta(seconds=_seconds(w)) for w in windows] == [
        health.SLOWING_WINDOW,
        health.SLOWING_BASELINE,
    ]
    # Both at once, for a while: neither an old snapshot nor slow cycles alone pages.
    assert "and on ()" in expr and _seconds(rule["for"]) > 0
    assert rule["labels"]["severity"] == "critical"  # the check's ERROR
    assert rule["annotations"]["runbook_url"] == health.RUNBOOK_VACUUM
