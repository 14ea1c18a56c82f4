"""Observability of the dispatcher: metrics ledger, Prometheus exporter, traces, health checks.

``ledger`` records each cycle in Postgres; ``exporter`` serves the design's metrics from it over
HTTP; ``tracing`` wraps cycles in OpenTelemetry spans; ``health`` evaluates the design's alert
conditions as plain functions (the Dagster asset checks call them).
"""
