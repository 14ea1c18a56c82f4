"""Observability of the dispatcher: the metrics ledger, the Prometheus exporter, traces and health checks.

``ledger`` records each cycle in Postgres; ``exporter`` serves the seed's metrics from it over
HTTP; ``tracing`` wraps cycles in OpenTelemetry spans; ``health`` evaluates the seed's alert
conditions as plain functions (the Dagster asset checks call them).
"""
