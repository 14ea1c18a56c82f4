"""Plain-Python domain rules: statuses, transitions, the ReminderDueEvent payload and its contract.

Nothing here imports SQLAlchemy, Kafka or Dagster.
"""
