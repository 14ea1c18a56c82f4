"""Online DDL for the migrations: what lets a DBA run ``db upgrade`` while the calendar writes.

* :func:`run_ddl`: one statement that takes a table lock (``ALTER TABLE … ADD COLUMN``, ``SET
  (…)``), in a transaction of its own, under :data:`LOCK_TIMEOUT_MS`, retried
  :data:`ATTEMPTS` times with a short back-off; then :class:`LockNotGranted`, one line naming
  the table, the lock and the session that holds it.
* :func:`create_index` / :func:`drop_index`: ``CREATE``/``DROP INDEX CONCURRENTLY`` (writes never
  wait for them); an INVALID index of that name, left by a failed concurrent build, is dropped
  and built again, a valid one is left alone.

Each runs outside the migration's transaction (Alembic's ``autocommit_block``, which commits
what the migration did before it) and is idempotent, so a migration stopped half-way is finished
by running it again (docs/deployment.md, "How an upgrade goes on a live database").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op
from psycopg import errors
from sqlalchemy.engine import Connection

from ...logs import event

log = logging.getLogger(__name__)

#: How long one DDL statement waits for its table lock before it gives up. While it waits, every
#: later write of that table queues behind it: this is what a calendar write can wait for a
#: migration that meets a long transaction, kept well under the 1 s the calendar tolerates. It
#: is shorter than PostgreSQL's deadlock_timeout (1 s), so an autovacuum holding the table is
#: not cancelled for it: the step retries around it (and names it if it outlasts the attempts).
LOCK_TIMEOUT_MS = 500
#: Attempts per statement before the migration stops (about half a minute with the back-off).
ATTEMPTS = 10
#: The pause after a timed-out attempt, doubled each time up to the cap (seconds). The statement
#: holds no lock meanwhile, so the writes that queued behind it go through.
BACKOFF_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 4.0

ACCESS_EXCLUSIVE = "AccessExclusiveLock"
SHARE_UPDATE_EXCLUSIVE = "ShareUpdateExclusiveLock"
#: The table locks that each step's own lock waits for (PostgreSQL's lock conflict table).
CONFLICTS = {
    ACCESS_EXCLUSIVE: [
        "AccessShareLock",
        "RowShareLock",
        "RowExclusiveLock",
        "ShareUpdateExclusiveLock",
        "ShareLock",
        "ShareRowExclusiveLock",
        "ExclusiveLock",
        "AccessExclusiveLock",
    ],
    SHARE_UPDATE_EXCLUSIVE: [
        "ShareUpdateExclusiveLock",
        "ShareLock",
        "ShareRowExclusiveLock",
        "ExclusiveLock",
        "AccessExclusiveLock",
    ],
}
#: How pg_locks names a mode, as a person writes it in SQL.
_MODE_WORDS = {
    ACCESS_EXCLUSIVE: "ACCESS EXCLUSIVE",
    SHARE_UPDATE_EXCLUSIVE: "SHARE UPDATE EXCLUSIVE",
}

# The session holding a lock on :relation that :modes conflict with, oldest transaction first,
# and how many sessions hold one. (pg_blocking_pids answers only while a session waits; the step
# has stopped waiting when this runs.) Another role's session shows its pid, application name and
# backend type; its state and transaction start only to a role with pg_read_all_stats. A
# prepared transaction holds its locks with no pid.
LOCK_HOLDER = sa.text(
    """
    SELECT h.*, count(*) OVER () AS holders
      FROM (
        SELECT DISTINCT ON (l.pid) l.pid, a.application_name, a.backend_type, a.state, l.mode,
               floor(EXTRACT(EPOCH FROM (clock_timestamp() - a.xact_start)))::int AS xact_seconds,
               a.xact_start
          FROM pg_locks l
          LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'relation'
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.relation = to_regclass(:relation)
           AND l.granted
           AND l.mode = ANY (CAST(:modes AS text[]))
           AND l.pid IS DISTINCT FROM pg_backend_pid()
         ORDER BY l.pid, l.mode
      ) AS h
     ORDER BY h.xact_start NULLS LAST, h.pid
     LIMIT 1
    """
)

# Whether index :name is valid: NULL when there is none, false for one a failed (or running)
# CREATE INDEX CONCURRENTLY left behind.
INDEX_VALID = sa.text("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:name)")


class LockNotGranted(RuntimeError):
    """A migration step did not get its table lock in any attempt; the message is one line."""


def run_ddl(statement: str, *, table: str, lock: str = ACCESS_EXCLUSIVE) -> None:
    """Run ``statement`` (which takes ``lock`` on ``table``) in its own transaction under a short
    lock_timeout, retried with back-off; :class:`LockNotGranted` if every attempt times out."""
    holder: dict[str, object] = {}
    words = " ".join(statement.split()[:2])
    with _autocommit() as conn, _lock_timeout(conn, LOCK_TIMEOUT_MS):
        pause = BACKOFF_SECONDS
        started = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                conn.exec_driver_sql(statement)
                event(
                    log,
                    logging.INFO,
                    "migration step: done",
                    step=f"{words} {table}",
                    attempts=attempt,
                    seconds=round(time.monotonic() - started, 3),
                )
                return
            except sa.exc.OperationalError as error:
                if not isinstance(error.orig, errors.LockNotAvailable):
                    raise
            holder = _holder(conn, table, lock)
            if attempt == ATTEMPTS:
                break
            event(
                log,
                logging.WARNING,
                "migration step: lock not granted within lock_timeout, retrying",
                table=table,
                lock=_MODE_WORDS.get(lock, lock),
                attempt=attempt,
                attempts=ATTEMPTS,
                lock_timeout_ms=LOCK_TIMEOUT_MS,
                retry_in_seconds=pause,
                **{f"holder_{key}": value for key, value in holder.items()},
            )
            time.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX_SECONDS)
    raise LockNotGranted(
        f"{words} {table}: its {_MODE_WORDS.get(lock, lock)} lock on {table} was not granted "
        f"within {LOCK_TIMEOUT_MS} ms in {ATTEMPTS} attempts; {_describe(holder)}; the migration "
        "stopped at this step, the steps before it are kept: run it again once that session ended"
    )


def create_index(name: str, table: str, columns: str, where: str | None = None) -> None:
    """``CREATE INDEX CONCURRENTLY`` unless a valid ``name`` exists; an invalid one is rebuilt."""
    with _autocommit() as conn:
        valid = conn.execute(INDEX_VALID, {"name": name}).scalar()
        if valid:
            event(log, logging.INFO, "migration step: index already built", index=name)
            return
        # No lock_timeout: a concurrent build takes no lock that blocks writes, but it waits for
        # the transactions older than it (a long report included). statement_timeout bounds it.
        with _lock_timeout(conn, 0):
            if valid is False:
                event(
                    log,
                    logging.WARNING,
                    "migration step: dropping the invalid index a failed build left",
                    index=name,
                )
                conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            event(log, logging.INFO, "migration step: building index concurrently", index=name)
            started = time.monotonic()
            predicate = f" WHERE {where}" if where else ""
            conn.exec_driver_sql(
                f"CREATE INDEX CONCURRENTLY {name} ON {table} ({columns}){predicate}"
            )
            event(
                log,
                logging.INFO,
                "migration step: index built",
                index=name,
                seconds=round(time.monotonic() - started, 3),
            )


def drop_index(name: str) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS``: writes never wait for it."""
    with _autocommit() as conn, _lock_timeout(conn, 0):
        conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def storage_parameters(parameters: dict[str, float | int]) -> str:
    """``name = value, …`` for ``ALTER TABLE … SET (…)``."""
    return ", ".join(f"{name} = {value}" for name, value in parameters.items())


@contextlib.contextmanager
def _autocommit() -> Iterator[Connection]:
    """The migration's connection outside its transaction (committed first): each statement is
    a transaction of its own, so its locks go as soon as it is done.

    A stop signal (``KeyboardInterrupt``, ``SystemExit``) in a statement leaves the connection
    invalid, and the block's exit then fails to restore its transaction: the stop, not that
    failure, is what propagates (``up`` stopped mid-migration exits 130; the migration re-runs)."""
    interrupted: BaseException | None = None
    try:
        with op.get_context().autocommit_block():
            try:
                yield op.get_bind()
            except BaseException as error:
                if not isinstance(error, Exception):
                    interrupted = error
                raise
    except Exception:
        if interrupted is not None:
            raise interrupted from None
        raise


@contextlib.contextmanager
def _lock_timeout(conn: Connection, milliseconds: int) -> Iterator[None]:
    """``lock_timeout`` for the session while the block runs (autocommit: SET LOCAL would not
    last), back to the session's default afterwards."""
    conn.exec_driver_sql(f"SET lock_timeout = {int(milliseconds)}")
    try:
        yield
    finally:
        if not conn.invalidated:
            conn.exec_driver_sql("RESET lock_timeout")


def _holder(conn: Connection, relation: str, lock: str) -> dict[str, object]:
    """The session holding a lock on ``relation`` that ``lock`` waits for ({} when none is left)."""
    row = conn.execute(LOCK_HOLDER, {"relation": relation, "modes": CONFLICTS[lock]}).first()
    if row is None:
        return {}
    return {key: value for key, value in row._mapping.items() if key != "xact_start"}


def _describe(holder: dict[str, object]) -> str:
    """The holder in a few words for the one-line error."""
    if not holder:
        return "no session held a conflicting lock any more when it was looked up"
    if holder["pid"] is None:
        return "held by a prepared transaction (pg_prepared_xacts: COMMIT or ROLLBACK PREPARED it)"
    details = [f'application "{holder["application_name"]}"', str(holder["backend_type"])]
    if holder.get("state"):
        details.append(str(holder["state"]))
    if holder.get("xact_seconds") is not None:
        details.append(f"its transaction open {holder['xact_seconds']} s")
    details.append(f"{holder['mode']}")
    others = int(str(holder["holders"])) - 1
    more = f" (and {others} more)" if others > 0 else ""
    return f"held by pid {holder['pid']} ({', '.join(details)}){more}"
