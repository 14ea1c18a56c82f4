-- The metrics exporter's login (psql, as the schema owner, after sql/dispatcher_role.sql): it may
-- read what the dispatcher's group role may read (no title, description or location of an event)
-- and write nothing. docker/compose.yaml's `db-reader-role` step runs it after every migration
-- (new tables get their grants), with the name and password in the environment (\getenv):
-- REMINDER_READER_DB_USER, REMINDER_READER_DB_PASSWORD. Idempotent.

\set ON_ERROR_STOP on
\getenv reader_login REMINDER_READER_DB_USER
\getenv reader_password REMINDER_READER_DB_PASSWORD

SELECT format('CREATE ROLE %I LOGIN', :'reader_login')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'reader_login') \gexec
ALTER ROLE :"reader_login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
    PASSWORD :'reader_password';
-- Read-only for every statement, even one that a later grant would allow to write.
ALTER ROLE :"reader_login" SET default_transaction_read_only = on;
GRANT USAGE ON SCHEMA public TO :"reader_login";

-- Exactly the dispatcher's SELECT rights, table-wide or column by column.
SELECT format('GRANT SELECT ON %I.%I TO %I', table_schema, table_name, :'reader_login')
  FROM information_schema.role_table_grants
 WHERE grantee = 'reminder_dispatcher' AND privilege_type = 'SELECT' \gexec
SELECT format('GRANT SELECT (%s) ON %I.%I TO %I',
              string_agg(quote_ident(column_name), ', '), table_schema, table_name,
              :'reader_login')
  FROM information_schema.column_privileges
 WHERE grantee = 'reminder_dispatcher' AND privilege_type = 'SELECT'
 GROUP BY table_schema, table_name \gexec
