#!/usr/bin/env bash
# First start of the PostgreSQL container only (docker-entrypoint-initdb.d), as the superuser:
# the notifications consumer's shared de-duplication store (`reminder-pipeline consume
# --dedup-url`). A database of its own (the notifications side must not depend on the calendar's
# schema) holding one table, reminder_dedup, and a login that can read, insert and delete rows
# of that table and do nothing else: no DDL, no other table, no other database.
#
# Names and the password come from the environment (never a command line):
#   NOTIFICATIONS_DEDUP_DB_PASSWORD (required), NOTIFICATIONS_DEDUP_DB_USER (notifications_dedup),
#   NOTIFICATIONS_DEDUP_DB_NAME (notifications).
# On a database created before this script existed, run it once by hand as the superuser:
#   docker compose exec -e NOTIFICATIONS_DEDUP_DB_PASSWORD=... postgres \
#     bash /docker-entrypoint-initdb.d/20-notifications-dedup.sh
set -euo pipefail
: "${NOTIFICATIONS_DEDUP_DB_PASSWORD:?set NOTIFICATIONS_DEDUP_DB_PASSWORD (the password of the de-dup login)}"
export NOTIFICATIONS_DEDUP_DB_USER="${NOTIFICATIONS_DEDUP_DB_USER:-notifications_dedup}"
export NOTIFICATIONS_DEDUP_DB_NAME="${NOTIFICATIONS_DEDUP_DB_NAME:-notifications}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" \
     --dbname "${POSTGRES_DB:-postgres}" <<'SQL'
\getenv login NOTIFICATIONS_DEDUP_DB_USER
\getenv password NOTIFICATIONS_DEDUP_DB_PASSWORD
\getenv database NOTIFICATIONS_DEDUP_DB_NAME

SELECT format('CREATE DATABASE %I', :'database')
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'database') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'login')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'login') \gexec
ALTER ROLE :"login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
    PASSWORD :'password';
-- Only this login connects to the store's database; it cannot connect anywhere else.
REVOKE CONNECT, TEMPORARY ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"database" TO :"login";

\connect :"database"
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"login";
-- recipient_user_id is the nil UUID on the row that marks a reminder fully handled; other_id is
-- the notification id of a delivery, the EventId of a handled mark. recorded_at on the
-- database's clock: the consumer deletes rows past its retention (30 days, over the 14-day
-- replay window of docs/contract.md).
CREATE TABLE IF NOT EXISTS reminder_dedup (
    reminder_id        uuid        NOT NULL,
    recipient_user_id  uuid        NOT NULL,
    other_id           uuid        NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (reminder_id, recipient_user_id)
);
CREATE INDEX IF NOT EXISTS reminder_dedup_recorded_at ON reminder_dedup (recorded_at);
REVOKE ALL ON reminder_dedup FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON reminder_dedup TO :"login";
SQL
