"""Observability tests: the metrics ledger and endpoint, health checks, traces, no PII in logs."""
