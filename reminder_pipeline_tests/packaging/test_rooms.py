"""The package's rooms: every module sits in a layer of the import contract, the root stays small,
no module grows past a page a newcomer can read, no function in the Dagster shell (defs/) past a
screen, and only defs/ imports Dagster."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reminder_pipeline"
#: Modules allowed at the package root besides __init__ and definitions: the foundation.
ROOT_MODULES = {
    "__init__",
    "definitions",
    "audit",
    "config",
    "logs",
    "memory",
}
MAX_LINES = 600
#: A function in defs/ (an op, a sensor, a helper) reads on one screen: its decorators not counted.
MAX_FUNCTION_LINES = 60


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _modules() -> list[str]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue  # Alembic's scripts: loaded by Alembic, imported by nothing
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found)


def _layer_containers() -> set[str]:
    """The rooms the package's layers contract names (the other layers contract is between the
    repository's packages: packaging/test_testkit.py)."""
    (layers,) = [
        c
        for c in _contracts()
        if c["type"] == "layers" and all(x.startswith("reminder_pipeline.") for x in c["layers"])
    ]
    return {
        name.strip() for layer in layers["layers"] for name in layer.replace("|", ":").split(":")
    }


def test_every_module_sits_in_a_layer_of_the_contract():
    containers = _layer_containers()
    outside = [
        module
        for module in _modules()
        if module != "reminder_pipeline"
        and not any(module == c or module.startswith(c + ".") for c in containers)
    ]
    assert not outside, f"modules in no layer of pyproject.toml's contract: {outside}"


def test_the_root_keeps_only_the_foundation():
    at_root = {p.stem for p in PACKAGE.glob("*.py")}
    assert at_root <= ROOT_MODULES, f"modules at the package root: {sorted(at_root - ROOT_MODULES)}"


def test_no_module_is_longer_than_a_page():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_function_in_defs_is_longer_than_a_screen():
    long = []
    for path in sorted((PACKAGE / "defs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)"
                    )
    assert not long, f"functions in defs/ over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_room_is_type_checked():
    """mypy's strict ``files`` take every room of the package, and no override of the package's
    own modules quiets it (``follow_imports = "silent"`` or ``ignore_errors``)."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    checked = {
        Path(f).relative_to("reminder_pipeline").parts[0]
        for f in mypy["files"]
        if Path(f).parts[0] == "reminder_pipeline"
    }
    quieted = [
        module
        for override in mypy.get("overrides", [])
        if override.get("follow_imports") == "silent" or override.get("ignore_errors")
        for module in override["module"]
        if module.startswith("reminder_pipeline")
    ]
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    unchecked = rooms - checked
    assert mypy["strict"] is True
    assert not unchecked, f"rooms mypy does not check: {sorted(unchecked)}"
    assert not quieted, f"package modules mypy is told to quiet: {quieted}"


def test_only_defs_and_definitions_may_import_dagster():
    (dagster,) = [
        c
        for c in _contracts()
        if "dagster" in c.get("forbidden_modules", []) and "Dagster shell" in c["name"]
    ]
    covered = set(dagster["source_modules"])
    tops = {m.split(".")[1] for m in _modules() if m.count(".") >= 1}
    expected = {f"reminder_pipeline.{t}" for t in tops} - {
        "reminder_pipeline.defs",
        "reminder_pipeline.definitions",
    }
    assert expected <= covered, f"not held by the Dagster contract: {sorted(expected - covered)}"
