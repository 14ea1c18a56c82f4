"""docs/configuration.md and docs/cli.md ("From a shell") match the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

import click

from reminder_pipeline.cli import cli
from reminder_pipeline.cli.exits import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
)

ROOT = Path(__file__).resolve().parents[2]
#: The page each section lives on.
PAGES = {"From a shell": "docs/cli.md", "Configuration": "docs/configuration.md"}


def section(title: str) -> str:
    """The page's text from the heading ``title`` to the next heading of the same level."""
    text = (ROOT / PAGES[title]).read_text()
    level = re.search(rf"^(#+) {re.escape(title)}$", text, re.MULTILINE)
    assert level, f"{PAGES[title]} has no section {title!r}"
    rest = text[level.end() :]
    following = re.search(rf"^{level.group(1)} ", rest, re.MULTILINE)
    return rest[: following.start()] if following else rest


def commands(group: click.Group = cli, path: str = "") -> dict[str, click.Command]:
    """Every leaf command by its path (``poison skip``)."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        full = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            found.update(commands(command, full))
        else:
            found[full] = command
    return found


def test_every_command_option_and_variable_is_in_from_a_shell():
    shell = section("From a shell")
    every = commands()
    assert len(every) >= 15
    for path, command in every.items():
        assert path.split()[0] in shell, f"`{path}` is not in docs/cli.md"
        for param in command.params:
            if isinstance(param, click.Option):
                flag = max(param.opts, key=len)
                assert f"`{flag}`" in shell, f"{path} {flag} is not in docs/cli.md"
                if param.envvar:
                    assert f"`{param.envvar}`" in shell, f"{path} {flag}: {param.envvar} missing"
    for param in cli.params:
        if isinstance(param, click.Option) and param.envvar:
            assert f"`{param.envvar}`" in shell and f"`{param.envvar}`" in section("Configuration")


def test_the_exit_codes_table_matches_the_code():
    shell = section("From a shell")
    table = dict(re.findall(r"^\| (\d+) \| ([^|]+) \|$", shell, re.MULTILINE))
    assert set(map(int, table)) == {
        EXIT_OK,
        EXIT_FAILURE,
        EXIT_USAGE,
        EXIT_PARTIAL,
        EXIT_INTERRUPTED,
    }
    assert table[str(EXIT_USAGE)].startswith("bad usage or configuration")
    assert table[str(EXIT_FAILURE)].startswith("runtime failure")
    assert table[str(EXIT_PARTIAL)].startswith("partial publish")


def test_every_setting_the_code_reads_is_in_configuration():
    configuration = section("Configuration")
    source = "".join(
        (ROOT / "reminder_pipeline" / name).read_text()
        for name in ("config.py", "local/endpoints.py")
    )
    names = set(re.findall(r'"((?:REMINDER|KAFKA|DAGSTER)_[A-Z_]+|DATABASE_URL)"', source))
    assert {"DATABASE_URL", "REMINDER_BATCH_SIZE", "KAFKA_SASL_PASSWORD"} <= names
    missing = sorted(name for name in names if f"`{name}`" not in configuration)
    assert not missing, f"not in docs/configuration.md: {missing}"
