-- Least privilege for the reminder dispatcher (run as the schema owner, after `reminder-pipeline db upgrade`).
--
-- `reminder_dispatcher` is a NOLOGIN group role with exactly what the dispatch cycle, the relay,
-- the outbox retention and the metrics ledger need. It can read no title, description or
-- location of a calendar event: those columns are PII and never leave the database.
-- Give a login role its rights with:  GRANT reminder_dispatcher TO <login role>;
-- Idempotent: safe to run again after every migration.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reminder_dispatcher') THEN
        CREATE ROLE reminder_dispatcher NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO reminder_dispatcher;

-- Events: the payload's fields and the status, nothing else.
REVOKE ALL ON calendar_events FROM reminder_dispatcher;
GRANT SELECT (id, tenant_id, owner_user_id, client_user_id, appointment_id, kind, status,
              start_at, time_zone)
    ON calendar_events TO reminder_dispatcher;

-- Reminders: read, and move Pending -> Sent/Skipped with the poison bookkeeping.
-- (FOR UPDATE needs UPDATE on at least one column.)
REVOKE ALL ON event_reminders FROM reminder_dispatcher;
GRANT SELECT ON event_reminders TO reminder_dispatcher;
GRANT UPDATE (status, sent_at, updated_at, attempts, last_error, next_attempt_at,
               reserved_by, reserved_until)
    ON event_reminders TO reminder_dispatcher;
-- When the last failed attempt was (migration 0006 and later), when present.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'
                  AND table_name = 'event_reminders' AND column_name = 'last_failed_at') THEN
        GRANT UPDATE (last_failed_at) ON event_reminders TO reminder_dispatcher;
    END IF;
    -- Who moved a reminder, in which run (migration 0007 and later), when present.
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'
                  AND table_name = 'event_reminders' AND column_name = 'moved_by') THEN
        GRANT UPDATE (moved_by, moved_in_run) ON event_reminders TO reminder_dispatcher;
    END IF;
END
$$;

-- Outbox: write rows, mark them published, purge them after the retention.
REVOKE ALL ON outbox FROM reminder_dispatcher;
GRANT SELECT, INSERT, DELETE ON outbox TO reminder_dispatcher;
GRANT UPDATE (published_at, publish_attempts) ON outbox TO reminder_dispatcher;
-- Where each message landed (migration 0006 and later), when present.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'
                  AND table_name = 'outbox' AND column_name = 'kafka_offset') THEN
        GRANT UPDATE (kafka_partition, kafka_offset) ON outbox TO reminder_dispatcher;
    END IF;
END
$$;
-- The re-publish back-fill's record of every copy it delivered (migration 0006 and later),
-- purged with its outbox row.
DO $$
BEGIN
    IF to_regclass('public.outbox_republishes') IS NOT NULL THEN
        GRANT SELECT, INSERT, DELETE ON outbox_republishes TO reminder_dispatcher;
    END IF;
END
$$;

-- Where the due scan and the relay's reads start (migration 0009 and later), when present: one
-- row each, inserted by its first writer, then updated.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['due_scan_position', 'outbox_relay_position'] LOOP
        IF to_regclass('public.' || t) IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON %I FROM reminder_dispatcher', t);
            EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I TO reminder_dispatcher', t);
        END IF;
    END LOOP;
END
$$;

-- The metrics ledger (migration 0002 and later), when present.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['dispatch_cycles', 'dispatch_metric_totals'] LOOP
        IF to_regclass('public.' || t) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO reminder_dispatcher', t);
        END IF;
    END LOOP;
END
$$;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO reminder_dispatcher;

-- The schema's revision: the dispatcher's commands refuse a database behind the code (they never
-- migrate; `reminder-pipeline db upgrade` does, as the owner).
GRANT SELECT ON alembic_version TO reminder_dispatcher;
