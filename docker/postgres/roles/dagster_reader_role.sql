-- The metrics exporter's login on Dagster's storage (psql, as the superuser, connected to the
-- `dagster` database, after sql/login_roles.sql made its owner): it may read Dagster's tables
-- (the exporter reads the daemons' heartbeats, instance.get_daemon_heartbeats()) and write
-- nothing. docker/compose.yaml's `db-dagster-reader-role` step runs it on every start, with the
-- names and password in the environment (\getenv): DAGSTER_READER_DB_USER,
-- DAGSTER_READER_DB_PASSWORD, and DAGSTER_DB_USER (the storage login that creates the tables).
-- Idempotent.
--
-- It runs before Dagster first starts, so before Dagster's storage login has created its tables:
-- the default privileges grant SELECT on every table that login creates later (and on those its
-- migrations add); the tables already there are granted now.

\set ON_ERROR_STOP on
\getenv reader_login DAGSTER_READER_DB_USER
\getenv reader_password DAGSTER_READER_DB_PASSWORD
\getenv storage_login DAGSTER_DB_USER

SELECT format('CREATE ROLE %I LOGIN', :'reader_login')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'reader_login') \gexec
ALTER ROLE :"reader_login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
    PASSWORD :'reader_password';
-- Read-only for every statement, even one that a later grant would allow to write.
ALTER ROLE :"reader_login" SET default_transaction_read_only = on;

-- login_roles.sql took CONNECT on this database from PUBLIC: this login gets it back, alone.
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'reader_login') \gexec
GRANT USAGE ON SCHEMA public TO :"reader_login";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"reader_login";
ALTER DEFAULT PRIVILEGES FOR ROLE :"storage_login" IN SCHEMA public
    GRANT SELECT ON TABLES TO :"reader_login";
