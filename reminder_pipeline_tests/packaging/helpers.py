"""Helpers of the packaging tests (declared dependencies, the locks, a plain install)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
PRODUCTION_LOCK = ROOT / "requirements" / "production.txt"
DEVELOPMENT_LOCK = ROOT / "requirements" / "development.txt"


def project() -> dict:
    """pyproject.toml's [project] table."""
    return tomllib.loads(PYPROJECT.read_text())["project"]


def declared(*extras: str) -> dict[str, Requirement]:
    """The runtime requirements plus those of ``extras``, by canonical distribution name."""
    table = project()
    lines = list(table["dependencies"])
    for extra in extras:
        lines += table["optional-dependencies"][extra]
    requirements = (Requirement(line) for line in lines)
    return {canonicalize_name(r.name): r for r in requirements}


@dataclass(frozen=True)
class Pin:
    """One locked package: its exact version and the hashes pip will accept."""

    name: str
    version: str
    hashes: tuple[str, ...]


_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;[^-]*)?((?:\s+--hash=sha256:[0-9a-f]{64})*)\s*$"
)


def pins(lock: Path) -> dict[str, Pin]:
    """The pins of a pip-tools lock: ``name==version`` with its ``--hash`` options."""
    found: dict[str, Pin] = {}
    text = lock.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        assert match, f"{lock.name}: not an exact pin with hashes: {line[:120]!r}"
        name, version, hashes = match.groups()
        found[canonicalize_name(name)] = Pin(
            name, version, tuple(re.findall(r"sha256:\w+", hashes))
        )
    return found
