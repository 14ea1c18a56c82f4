"""Headless Chromium for Playwright: Debian's package (``apt-get install chromium``, no browser
download), driven through ``executable_path`` with :data:`CHROMIUM_FLAGS`.

The UI tests (``e2e/``) and the Runs page figure of ``benchmarks.dagster_storage`` launch it so::

    p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
"""

from __future__ import annotations

import shutil

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """The system Chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")
