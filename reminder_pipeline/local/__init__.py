"""The local stack (the ``embedded`` extra): the embedded PostgreSQL and broker, Dagster's
processes for ``up``, the calendar stand-in and the demo data. Production never imports it."""
