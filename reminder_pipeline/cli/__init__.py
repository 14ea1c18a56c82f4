"""``reminder-pipeline``: a thin command line over the same use cases the Dagster ops call."""

from .app import cli, main
from .exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from .output import ProgressLine

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "ProgressLine",
    "cli",
    "main",
]
