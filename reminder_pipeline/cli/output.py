"""What the command line prints: text or JSON data, one-line errors, progress lines (the exit
codes: :mod:`.exits`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from ..config import libpq_url, mask_secrets

PROG = "reminder-pipeline"


def command_as_started(argv0: str | None = None) -> str:
    """This CLI as the user started it, runnable as printed from where they are: the path typed
    (``.venv/bin/reminder-pipeline`` from ``scripts/up``), the bare name when it came from PATH,
    or ``<python> -m reminder_pipeline.cli``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) in ("__main__.py", "-m", "-c", ""):
        return f"{_from_here(sys.executable)} -m reminder_pipeline.cli"
    return _from_here(argv0) if os.path.isabs(argv0) else shlex.quote(argv0)


def _from_here(path: str) -> str:
    """An absolute path, relative when it lies under the working directory (still a path)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return shlex.quote(path)
    if relative.startswith(".."):
        return shlex.quote(path)
    return shlex.quote(relative if os.sep in relative else f".{os.sep}{relative}")


def error_line(message: str) -> str:
    """``reminder-pipeline: error: <message>``, one line, any URL's password masked."""
    return f"{PROG}: error: {mask_secrets(' '.join(str(message).split()))}"


def psql_url(database_url: str) -> str:
    """A database URL as ``up`` and ``services status`` show it: the form psql and other libpq
    clients take (no SQLAlchemy driver, libpq's host list), the password masked."""
    return mask_secrets(libpq_url(database_url))


def print_error(message: str, stream: TextIO | None = None) -> None:
    """Write the one-line error to stderr."""
    print(error_line(message), file=stream or sys.stderr, flush=True)


def print_json(data: Any) -> None:
    """Data as indented JSON on stdout (ids, counts, ISO timestamps as text)."""
    print(json.dumps(data, default=str, indent=2), flush=True)


def print_fields(title: str, data: Mapping[str, Any]) -> None:
    """One ``title: key=value key=value`` line on stdout (None values left out)."""
    fields = " ".join(f"{key}={_text(value)}" for key, value in data.items() if value is not None)
    print(f"{title}: {fields}", flush=True)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], empty: str) -> None:
    """Rows as aligned columns on stdout, or ``empty`` when there are none."""
    if not rows:
        print(empty, flush=True)
        return
    cells = [[_text(row.get(column)) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)
    ]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    sys.stdout.flush()


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return " ".join(str(value).split())


class ProgressLine:
    """A progress line on a stream (stderr by default) at most once every ``every_seconds``.

    Long work calls :meth:`tick` (any status text) or :meth:`rows` (a drain) as often as it
    likes; a line is written only when ``every_seconds`` have passed since the start or the last
    line, so short work prints nothing and stdout stays the command's data.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        every_seconds: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.every_seconds = every_seconds
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self.lines = 0

    def elapsed(self) -> float:
        """Seconds since this progress line was created."""
        return self._clock() - self._started

    def due(self) -> bool:
        """True when a line would be written now."""
        return self._clock() - self._last_line >= self.every_seconds

    def write(self, text: str) -> None:
        """Write ``text`` now, whatever the interval."""
        print(f"{PROG}: {text}", file=self.stream or sys.stderr, flush=True)
        self._last_line = self._clock()
        self.lines += 1

    def tick(self, text: str | Callable[[], str]) -> bool:
        """Write ``text`` (or what it returns) if a line is due; True when one was written."""
        if not self.due():
            return False
        self.write(text() if callable(text) else text)
        return True

    def rows(self, rows_done: int, backlog_left: int | None) -> bool:
        """The catch-up drain's line: rows done, rows per second since the start, backlog left."""
        return self.tick(lambda: self.rows_text(rows_done, backlog_left))

    def rows_text(self, rows_done: int, backlog_left: int | None) -> str:
        """``drain: 12,000 rows done, 5,900 rows/s, 88,000 left (2 s)``."""
        elapsed = self.elapsed()
        rate = rows_done / elapsed if elapsed > 0 else 0.0
        left = "backlog unknown" if backlog_left is None else f"{backlog_left:,} left"
        return f"drain: {rows_done:,} rows done, {rate:,.0f} rows/s, {left} ({elapsed:.0f} s)"
