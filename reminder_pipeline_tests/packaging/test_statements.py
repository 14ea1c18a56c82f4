"""Every statement the store runs is written whole, in one place, with a line saying what it does.

Read from the source, no server: each module-level statement of the store's statement modules is
one string literal (no f-string, no ``.format()``, no fragment joined in), so the text the
database runs is the text in the file, ready to paste into psql; each has a ``#:`` line above it;
and the ledger's statements name every counter the ledger keeps (they are written out, not
derived from the counters' list).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reminder_pipeline.domain.model import LEDGER_COUNTERS, TOTALED_COUNTERS
from reminder_pipeline.store import metrics_queries

STORE = Path(__file__).resolve().parents[2] / "reminder_pipeline" / "store"
MODULES = ("queries.py", "outbox_queries.py", "metrics_queries.py", "operator_queries.py")


def _statements(module: str):
    """(name, the value's node, the source lines) of each module-level constant in ``module``."""
    source = (STORE / module).read_text()
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                yield target.id, node, lines


def _is_statement(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "text"
    ) or (isinstance(value, ast.Constant) and isinstance(value.value, str))


@pytest.mark.parametrize("module", MODULES)
def test_each_statement_is_one_string_literal_with_a_line_above_it(module):
    found, fragments, undescribed = [], [], []
    for name, node, lines in _statements(module):
        value = node.value
        if not _is_statement(value):
            continue
        found.append(name)
        text = value.args[0] if isinstance(value, ast.Call) else value
        if not (isinstance(text, ast.Constant) and isinstance(text.value, str)):
            fragments.append(name)
        if not lines[node.lineno - 2].lstrip().startswith("#:"):
            undescribed.append(name)
    assert found, f"no statement found in {module}"
    assert not fragments, f"{module}: statements assembled from pieces: {fragments}"
    assert not undescribed, f"{module}: statements without a '#:' line above: {undescribed}"


def test_the_ledger_statements_name_every_counter_it_keeps():
    def names(statement) -> str:
        return " ".join(statement.text.split())

    for counter in LEDGER_COUNTERS:
        assert f":{counter}" in names(metrics_queries.INSERT_CYCLE), counter
    for counter in TOTALED_COUNTERS:
        assert f"c.{counter}" in names(metrics_queries.DELETE_ROLL_UP_CANDIDATES), counter
        assert f"{counter} = :{counter}" in names(metrics_queries.UPDATE_TOTALS), counter
        assert f"sum({counter})" in names(metrics_queries.SUM_DETAIL), counter
