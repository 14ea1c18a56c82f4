"""Operator jobs' plain code: poison rows, outbox retention, the re-publish back-fill.

The Dagster jobs in :mod:`reminder_pipeline.defs` and the CLI are thin adapters over it.
"""
