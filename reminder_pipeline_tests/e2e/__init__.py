"""End-to-end tests through real Dagster processes (webserver, daemon)."""
