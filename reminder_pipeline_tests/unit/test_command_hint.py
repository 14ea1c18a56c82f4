"""The commands ``up`` prints run as printed from where the user is (no server)."""

from __future__ import annotations

import os
import sys

from reminder_pipeline.cli.output import command_as_started


def test_the_path_typed_stays_as_typed():
    assert command_as_started(".venv/bin/reminder-pipeline") == ".venv/bin/reminder-pipeline"
    assert command_as_started("reminder-pipeline") == "reminder-pipeline"  # found on PATH


def test_an_absolute_path_under_here_is_shortened_and_stays_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert command_as_started(str(tmp_path / "bin" / "rp")) == os.path.join("bin", "rp")
    # In the working directory itself: ./rp, never a bare name the shell looks up on PATH.
    assert command_as_started(str(tmp_path / "rp")) == os.path.join(".", "rp")
    elsewhere = "/opt/elsewhere/bin/reminder-pipeline"
    assert command_as_started(elsewhere) == elsewhere


def test_python_dash_m_is_the_interpreter_and_the_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program, dash_m, module = command_as_started("/x/reminder_pipeline/cli/__main__.py").split()
    assert os.path.samefile(program, sys.executable)
    assert (dash_m, module) == ("-m", "reminder_pipeline.cli")


def test_a_path_with_a_space_is_quoted():
    assert command_as_started("my tools/reminder-pipeline") == "'my tools/reminder-pipeline'"
