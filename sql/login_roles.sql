-- The deployment's login roles (psql, as the schema owner, after dispatcher_role.sql):
--
--   * the app login, a member of reminder_dispatcher and nothing more: what the Dagster user code
--     (dispatch runs, sensors, operator jobs) and the metrics exporter connect as;
--   * the Dagster login, the owner of Dagster's own storage database, and of
--     nothing in the application's database.
--
-- docker/compose.yaml's `db-roles` step runs it on every start (so a changed password applies):
--   psql -v ON_ERROR_STOP=1 -f sql/dispatcher_role.sql -f sql/login_roles.sql
-- with the names and passwords in the environment (read with \getenv, psql 15 or later, so no
-- password is ever on a command line): REMINDER_APP_DB_USER, REMINDER_APP_DB_PASSWORD,
-- DAGSTER_DB_USER, DAGSTER_DB_PASSWORD, DAGSTER_DB_NAME. Idempotent. psql's variables (:'x' a
-- literal, :"x" an identifier) do the quoting; a variable left unset is a syntax error, not a
-- role with an empty password.

\set ON_ERROR_STOP on
\getenv app_login REMINDER_APP_DB_USER
\getenv app_password REMINDER_APP_DB_PASSWORD
\getenv dagster_login DAGSTER_DB_USER
\getenv dagster_password DAGSTER_DB_PASSWORD
\getenv dagster_database DAGSTER_DB_NAME

SELECT format('CREATE ROLE %I LOGIN', :'app_login')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app_login') \gexec
ALTER ROLE :"app_login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION INHERIT
    PASSWORD :'app_password';
GRANT reminder_dispatcher TO :"app_login";

SELECT format('CREATE ROLE %I LOGIN', :'dagster_login')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'dagster_login') \gexec
ALTER ROLE :"dagster_login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    PASSWORD :'dagster_password';
-- Dagster creates and migrates its own tables on first use: it owns its database (from
-- PostgreSQL 15 on, the owner of a database may create in its public schema; nobody else may).
ALTER DATABASE :"dagster_database" OWNER TO :"dagster_login";
REVOKE CONNECT ON DATABASE :"dagster_database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"dagster_database" TO :"dagster_login";
