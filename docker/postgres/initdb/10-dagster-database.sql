-- First start of the PostgreSQL container only (docker-entrypoint-initdb.d): Dagster's storage
-- gets its own database next to the app's (POSTGRES_DB=calendar). Both use an alembic_version
-- table and Dagster uses generic table names (runs, jobs, kvs), so they must not share a schema.
CREATE DATABASE dagster;
