"""Test support in one home: the tests and the benchmarks share ``reminder_pipeline_testkit`` and
reach each other only through it (a test runs a benchmark as a command, ``python -m benchmarks.x``);
the import contract says so, and the support ships in no wheel and is type-checked like the package.
"""

from __future__ import annotations

import ast
import re
import tomllib
from fnmatch import fnmatch

from .helpers import PYPROJECT, ROOT

TESTS, BENCHMARKS, SUPPORT = "reminder_pipeline_tests", "benchmarks", "reminder_pipeline_testkit"


def _tool() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]


def _imported(folder: str) -> set[str]:
    """The modules the Python files under ``folder`` import (absolute imports, lazy ones too)."""
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_the_contract_keeps_the_tests_and_the_benchmarks_apart() -> None:
    linter = _tool()["importlinter"]
    assert set(linter["root_packages"]) == {"reminder_pipeline", SUPPORT, TESTS, BENCHMARKS}
    layers = [
        [name.strip() for name in layer.split("|")]
        for contract in linter["contracts"]
        if contract["type"] == "layers" and "reminder_pipeline" in contract["layers"]
        for layer in contract["layers"]
    ]
    assert layers == [[TESTS, BENCHMARKS], [SUPPORT], ["reminder_pipeline"]]


def test_no_test_reaches_into_a_benchmark_not_even_in_a_string() -> None:
    """The contract reads import statements; code handed to ``python -c`` or a name given to
    ``monkeypatch.setattr`` is text. Neither side names the other's modules to import them."""
    crossing = {
        TESTS: re.compile(rf"\b(?:from|import)\s+{BENCHMARKS}\b|[\"']{BENCHMARKS}\.\w+\.\w+[\"']"),
        BENCHMARKS: re.compile(rf"\b(?:from|import)\s+{TESTS}\b"),
        SUPPORT: re.compile(rf"\b(?:from|import)\s+(?:{TESTS}|{BENCHMARKS})\b"),
    }
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder, pattern in crossing.items()
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_each_module_of_the_support_serves_both_sides() -> None:
    """What only the tests use belongs in the tests (``support.py``), what only the benchmarks
    use in ``benchmarks/``: the support holds what both need."""
    modules = {p.stem for p in (ROOT / SUPPORT).glob("*.py") if not p.stem.startswith("_")}
    assert {"fault_proxy", "netns", "replica", "servers", "browser"} <= modules
    for side in (TESTS, BENCHMARKS):
        used = {m.split(".")[1] for m in _imported(side) if m.startswith(f"{SUPPORT}.")}
        assert modules <= used, f"{side} uses none of {sorted(modules - used)}"


def test_the_support_ships_in_no_wheel_and_is_checked_like_the_package() -> None:
    tool = _tool()
    find = tool["setuptools"]["packages"]["find"]
    tops = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert {"reminder_pipeline", SUPPORT, TESTS, BENCHMARKS} <= tops
    shipped = {
        top
        for top in tops
        if any(fnmatch(top, pattern) for pattern in find["include"])
        and not any(fnmatch(top, pattern) for pattern in find["exclude"])
    }
    assert shipped == {"reminder_pipeline"}  # the support's name matches reminder_pipeline*
    assert SUPPORT in tool["mypy"]["files"] and tool["mypy"]["strict"] is True
    assert SUPPORT in tool["ruff"]["lint"]["isort"]["known-first-party"]
