"""The repository's text files: no merge left half done."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("<<<<<<< ", ">>>>>>> ", "=======\n")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    names = (
        listed.stdout.split()
        if listed.returncode == 0
        else [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if ".venv" not in p.parts]
    )
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sql", ".json", ".sh", ""}
    return [ROOT / n for n in names if Path(n).suffix in suffixes and (ROOT / n).is_file()]


def test_no_file_holds_merge_conflict_markers():
    found = []
    for path in _tracked_text_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{n}"
            for n, line in enumerate(lines, 1)
            if line.startswith(MARKERS)
        ]
    assert not found, found
