"""Every file, folder, test and module that README.md and docs/ name exists in the tree.

Docs outlive the code they describe: a page that names a moved module or a renamed test sends a
newcomer nowhere. Checked as text, no server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "benchmarks" / "README.md",
]
#: Where a relative path in a doc may start: the doc's folder, the root, the package, the tests.
BASES = ("", "reminder_pipeline", "reminder_pipeline_tests")
#: Paths that exist only at run time (data, artifacts, an instance), never in the tree.
RUNTIME = (".reminder-pipeline", "test-artifacts", ".venv", "$", "<", "~", "/")
EXTENSIONS = ("py", "md", "yaml", "yml", "json", "sql", "sh", "toml", "txt", "mako", "ini", "conf")

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(rf"^[\w.\-/]+(\.(?:{'|'.join(EXTENSIONS)})(?:::[\w\[\]\-…]+)*|/)$")
MODULE = re.compile(r"python -m ((?:benchmarks|reminder_pipeline)(?:\.\w+)*)")


def _exists(doc: Path, path: str) -> Path | None:
    for base in (doc.parent, *(ROOT / b for b in BASES)):
        if (base / path).exists():
            return base / path
    return None


def _named_paths(doc: Path) -> list[str]:
    text = doc.read_text()
    found = []
    for target in LINK.findall(text):
        if not re.match(r"^(https?:|mailto:|#)", target):
            found.append(target.split("#")[0])
    for token in CODE.findall(text):
        if "/" in token and PATHLIKE.match(token) and not token.startswith(RUNTIME):
            found.append(token)
    return [f for f in found if f]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path):
    missing = []
    for named in _named_paths(doc):
        path, _, test = named.partition("::")
        where = _exists(doc, path)
        if where is None:
            missing.append(named)
        elif test:
            # `file.py::test_name` (a trailing … abbreviates it): that test is in the file.
            name = test.split("::")[-1].split("[")[0].rstrip("…")
            if name and name not in where.read_text():
                missing.append(named)
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_module_a_doc_runs_exists(doc: Path):
    missing = []
    for module in MODULE.findall(doc.read_text()):
        relative = Path(*module.split("."))
        if not ((ROOT / relative).with_suffix(".py").exists() or (ROOT / relative).is_dir()):
            missing.append(module)
    assert not missing, f"{doc.relative_to(ROOT)} runs modules that do not exist: {missing}"


def test_the_check_sees_the_paths_it_is_about():
    """The patterns find the paths the docs really cite (so a pass is not an empty check)."""
    named = {p for doc in DOCS for p in _named_paths(doc)}
    assert "docs/design.md" in named
    assert any(p.startswith("integration/test_") and "::" in p for p in named)
    assert any(p.startswith("reminder_pipeline/") for p in named)


def test_the_readme_is_a_door():
    """The README says what this is, the two commands and where to read on; reference and
    operations live in docs/ (a newcomer reads the front page whole)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "./scripts/up" in readme and "./scripts/test" in readme
    linked = set(LINK.findall(readme))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_the_docs_index_lists_every_page():
    """docs/README.md is the index of docs/: every page (the glossary too) is in its table."""
    linked = set(LINK.findall((ROOT / "docs" / "README.md").read_text()))
    pages = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert "glossary.md" in pages
    assert pages <= linked, f"docs pages docs/README.md does not link: {sorted(pages - linked)}"


def test_nothing_a_user_reads_cites_the_seed():
    """Users have docs/design.md and docs/contract.md, not the spec they were written from."""
    places = [ROOT / "README.md", ROOT / "dagster.yaml"]
    folders = ("reminder_pipeline", "reminder_pipeline_testkit", "docs", "docker", "benchmarks")
    for folder in (*folders, "sql", "scripts"):
        places += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    citing = []
    for path in places:
        try:
            text = path.read_text(encoding="utf-8").lower()
        except UnicodeDecodeError:
            continue
        if "the seed" in text or "seed's" in text:
            citing.append(str(path.relative_to(ROOT)))
    assert not citing, f"these cite 'the seed' (name docs/design.md or docs/contract.md): {citing}"
