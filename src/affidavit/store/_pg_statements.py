"""The PostgreSQL backend's statements as text: the claim, values bound as literals, the
prepared statements' names and numbered placeholders, and the refusals the server's own checks
raise (SQLSTATEs of migration 9 and the ledger's)."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from dataclasses import replace
from typing import Any

import psycopg

from affidavit.core.errors import (
    AffidavitError,
    CancelRequestedError,
    JobNotFound,
    LedgerRowExists,
)
from affidavit.store._ledger import (
    LEDGER_FINISH,
    LEDGER_INSERT_NEW,
    claimed_from_row,
    runnable_jobs,
)
from affidavit.store._seals import KEY_INSERT, LEAF_QUEUE_INSERT, SEAL_INSERT
from affidavit.store._sql import (
    EVENT_COLUMNS,
    EVENT_INSERT,
    HEAD_SELECT,
    LOCK_JOB,
    STATUS_UPDATE_FENCED,
)
from affidavit.store._sql_rows import (
    conflict,
    event_from_row,
    fenced,
    head_moved,
)
from affidavit.store.base import (
    Claimed,
)

SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
# Reads of a log or ledger in key order, in snapshots and in pages. The planner estimates a
# job's rows from the table's statistics, which know nothing of one long job among many short
# ones (nor of any job before the table is next analyzed): for "WHERE job_id = ? ORDER BY
# version" it then collects the job's rows with a bitmap scan and sorts them — for 100,000
# events a 37 MB sort spilled to disk before the first row is sent, and for every page of
# "... LIMIT n" a sort of all the rows after it (paging through a log becomes quadratic).
# The primary keys hold those rows in that order: with sorting made the planner's last resort
# it walks the key instead, and rows stream from the first. Only where those are read:
# snapshots (which begin so and set the default back before listing jobs: see
# PostgresSnapshot), a log read by the store (in a transaction of its own: see _log_reader) or
# in a transaction (PostgresTransaction.list_events).
IN_KEY_ORDER = "SET LOCAL enable_sort = off"
IN_KEY_ORDER_RESET = "SET LOCAL enable_sort TO DEFAULT"

_RECOVERY = "c.status = 'running' AND c.lease_owner IS NOT NULL"  # (as claimed_from_row)
_CLAIM_UPDATE = (
    "UPDATE jobs SET status = 'running', attempt_id = ?, lease_owner = ?, lease_expires_at = ?, "
    f"updated_at = ?, recoveries = CASE WHEN {_RECOVERY} THEN c.recoveries ELSE 0 END, "
    f"recovery_progress = CASE WHEN {_RECOVERY} THEN c.recovery_progress END "
    "FROM c WHERE jobs.job_id = c.job_id "
    "RETURNING c.job_id, c.status, c.lease_owner, c.recoveries, c.recovery_progress, "
    "set_config('affidavit.claimed', c.job_id, true)"
)
# The log of the job the claim before it in the transaction took (see claim)
_CLAIMED_LOG = (
    f"SELECT {EVENT_COLUMNS} FROM events "
    "WHERE job_id = current_setting('affidavit.claimed', true) ORDER BY version"
)


def _results(cursor: psycopg.ClientCursor[Any]) -> list[list[Any]]:
    """The rows of each statement of the message ``cursor`` sent last, in order (none for a
    statement that returns no rows)."""
    results: list[list[Any]] = []
    while True:
        results.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return results


def _claimed(results: list[list[Any]]) -> Claimed | None:
    """The job the reads of :meth:`PostgresTransaction._claim_reads` took (their results, in
    order), with its log when they read it; ``None`` if nothing was runnable."""
    rows = results[0]
    if not rows:
        return None
    claimed = claimed_from_row(rows[0][:5])
    if len(results) == 1:
        return claimed
    return replace(claimed, log=tuple(event_from_row(row) for row in results[2]))


def _claim_statement(candidates: str) -> str:
    return f"WITH c AS ({candidates}{SKIP_LOCKED}) {_CLAIM_UPDATE}"


def _literal(value: Any) -> str | None:
    """``value`` as an SQL literal, exactly as psycopg's client-side binding writes it, for the
    types the store's statements bind most (text, integers, finite floats, bytes, booleans,
    NULL); ``None`` for any other value (and for text holding NUL, which PostgreSQL refuses,
    and for an infinite or NaN float): psycopg binds the statement then. A tool step binds
    about forty values; this is several times faster than going through psycopg's adapters
    for each.

    Text is quoted by doubling its quotes; text holding a backslash is written as an escape
    string (``E'...'``) with the backslashes doubled too, and bytes as an escape string of
    their hex form, so what the server reads does not depend on
    ``standard_conforming_strings``. A negative number is written after a space, as
    psycopg does, so that no ``-`` before it can make a comment."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            return None
        quoted = text.replace("'", "''")
        if "\\" in text:
            return "E'" + quoted.replace("\\", "\\\\") + "'"
        return "'" + quoted + "'"
    if kind is int:
        number: int = value
        return str(number) if number >= 0 else f" {number}"
    if kind is float:
        real: float = value
        if not math.isfinite(real):
            return None
        written = repr(real)
        return " " + written if written.startswith("-") else written  # (-0.0 too)
    if kind is bytes:
        data: bytes = value
        return "E'\\\\x" + data.hex() + "'::bytea"
    if value is None:
        return "NULL"
    if kind is bool:
        return "true" if value else "false"
    return None


_VALUES_TAIL = re.compile(r"\bVALUES (\([?, ]+\))\Z")


@functools.lru_cache(maxsize=64)
def _single_row_values(sql: str) -> str | None:
    """The ``(?, ...)`` row of an ``INSERT ... VALUES (?, ...)`` that ends there (nothing after
    it: no ``ON CONFLICT``, no ``RETURNING``), which more rows may follow; else ``None``."""
    if not sql.startswith("INSERT INTO "):
        return None
    found = _VALUES_TAIL.search(sql)
    return found.group(1) if found else None


def _first(rows: list[Any]) -> Any:
    return rows[0] if rows else None


_APPEND_GUARD = "SELECT affidavit_append_guard(?, ?, ?::bigint, ?)"

# The statements sent per claim, per tool step (T1 and T2) and per job's end, prepared once per
# connection (see PostgresTransaction._executed). Each names its tables and columns, so a
# migration that adds a column does not change what a prepared one returns.
_PREPARED_STATEMENTS = frozenset(
    {
        _claim_statement(runnable_jobs(0.0, None, ())[0]),  # (the next job, any)
        LEDGER_INSERT_NEW,
        LOCK_JOB,
        HEAD_SELECT,
        _APPEND_GUARD,
        EVENT_INSERT,
        LEDGER_FINISH,
        STATUS_UPDATE_FENCED,
        KEY_INSERT,
        SEAL_INSERT,
        LEAF_QUEUE_INSERT,
        _CLAIMED_LOG,
    }
)
# A multi-row insert is one prepared statement per number of rows, up to this many (a tool
# step appends 2 or 3 events at a time); a longer one is sent as it is.
_PREPARED_ROWS_MAX = 8


@functools.lru_cache(maxsize=64)
def _statement_name(sql: str, rows: int) -> str:
    """The name a connection prepares ``sql`` under (``rows``: of its VALUES): from its text,
    so the same statement has the same name on every connection and in every process."""
    return f"affidavit_{hashlib.sha256(sql.encode()).hexdigest()[:16]}_{rows}"


@functools.lru_cache(maxsize=64)
def _numbered(sql: str, rows: int) -> str:
    """``sql`` with its ``?`` placeholders numbered ``$1``, ``$2``, ... for ``PREPARE``,
    with ``rows`` rows when it is an ``INSERT ... VALUES (?, ...)`` (else ``rows`` is 1)."""
    values = _single_row_values(sql)
    if rows > 1 and values is not None:
        sql = sql[: len(sql) - len(values)] + ", ".join([values] * rows)
    pieces = sql.split("?")
    numbered = [pieces[0]]
    for number, piece in enumerate(pieces[1:], start=1):
        numbered.append(f"${number}{piece}")
    return "".join(numbered)


# SQLSTATEs of affidavit_append_guard's refusals (migration 9)
_GUARD_STATES = frozenset({"AFJ01", "AFJ02", "AFJ03", "AFJ04"})


def guard_refusal(exc: psycopg.Error) -> AffidavitError | None:
    """The error an append's own check raises, for a refusal of ``affidavit_append_guard``
    (``None`` for any other error)."""
    if exc.sqlstate not in _GUARD_STATES:
        return None
    said = json.loads(exc.diag.message_detail or "{}")
    job_id = str(said.get("job_id"))
    if exc.sqlstate == "AFJ01":
        return JobNotFound(job_id)
    if exc.sqlstate == "AFJ02":
        return fenced(job_id, str(said["fence"]), said.get("current"))
    if exc.sqlstate == "AFJ03":
        return conflict(job_id, int(said["expected"]), int(said["actual"]))
    return head_moved(job_id, int(said["expected"]))


def cancel_refusal(exc: psycopg.Error) -> CancelRequestedError | None:
    """A write refused because the job has a cancel request (migration 17, AFJ05)."""
    if exc.sqlstate != "AFJ05":
        return None
    job_id = str(json.loads(exc.diag.message_detail or "{}").get("job_id"))
    return CancelRequestedError(f"job {job_id} was asked to cancel", job_id=job_id)


def ledger_row_exists(exc: psycopg.Error) -> LedgerRowExists | None:
    """A ledger insert sent as presumed new (send_presumed_new) that met the key's row."""
    if not isinstance(exc, psycopg.errors.UniqueViolation):
        return None
    if exc.diag.table_name != "tool_invocations":
        return None
    return LedgerRowExists("the tool step's ledger row already exists; nothing was written")
