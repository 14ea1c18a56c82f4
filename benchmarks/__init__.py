"""Benchmarks of the reminder dispatcher, side by side with their baselines (``python -m benchmarks.bench``).

Not part of the test suite and not shipped in the package: run from the repository root.
"""
