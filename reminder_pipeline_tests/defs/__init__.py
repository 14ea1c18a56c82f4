"""Tests of the Dagster layer (jobs, schedule, resources, re-execution) on the real test servers."""
