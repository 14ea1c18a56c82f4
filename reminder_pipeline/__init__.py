"""reminder-pipeline: the calendar's reminder dispatcher on Postgres, Kafka and Dagster."""

__version__ = "0.1.0"
