"""The Dagster layer over the plain cycle: resources, ops, jobs, schedules, the asset and its
checks, the operator jobs' ops (``maintenance``) and the failure sensor that completes the ledger.

The modules only wrap :mod:`reminder_pipeline.cycle` and friends; the rules (locking, the
transaction that writes, the outbox) live in the plain code so the CLI, the tests and Dagster run
the same thing. :mod:`reminder_pipeline.definitions` assembles them into ``defs``.
"""
