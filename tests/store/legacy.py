"""A database as the release before migration 6 left it: its schema (migration 5) and its data.

Made from a current database by undoing migrations 15, 12, 11, 10, 9 (PostgreSQL's only), 8, 7 and 6
in SQL, so that the data in it is what the runtime really writes; the tests then check what this
version does with such a database (upgrade it, or read it read-only).
"""

from __future__ import annotations

from affidavit.store import migrations
from tests.verify.helpers import RawDb, reseal_v1


def _events_table_of_migration_1() -> str:
    """Migration 1's CREATE TABLE of the events table, for a table named ``events_v5``."""
    first = migrations.load("sqlite")[0]
    [create] = [s for s in first.statements() if s.startswith("CREATE TABLE events")]
    return create.replace("CREATE TABLE events", "CREATE TABLE events_v5", 1)


_SQLITE = [
    "DROP TRIGGER jobs_numbered",
    "DROP INDEX jobs_number",
    "ALTER TABLE jobs DROP COLUMN number",
    _events_table_of_migration_1(),
    # the rows, in their order
    "INSERT INTO events_v5 (job_id, version, event_id, type, payload, chain_hash, recorded_at) "
    "SELECT job_id, version, event_id, type, payload, chain_hash, recorded_at FROM events "
    "ORDER BY seq",
    "DROP TABLE events",
    "ALTER TABLE events_v5 RENAME TO events",
]
_POSTGRES = [
    "DROP INDEX events_chosen_event_id",
    "ALTER TABLE events ADD CONSTRAINT events_event_id_key UNIQUE (event_id)",
]


# the listing indexes as migration 1 made them (the same on both backends)
_UNDO_8 = [
    "DROP INDEX jobs_namespace",
    "DROP INDEX jobs_status",
    "CREATE INDEX jobs_status ON jobs (status, namespace)",
    "DROP INDEX jobs_created",
    "CREATE INDEX jobs_created ON jobs (created_at)",
    "DELETE FROM affidavit_schema_migrations WHERE version = 8",
]
_UNDO_9_POSTGRES = [
    "DROP FUNCTION affidavit_append_guard(TEXT, TEXT, BIGINT, TEXT)",
    "DELETE FROM affidavit_schema_migrations WHERE version = 9",
]
# the transparency log's tables (migration 10, both backends)
_UNDO_10 = [
    *(
        f"DROP TABLE {t}"
        for t in (
            "tlog_queue",
            "tlog_leaves",
            "tlog_nodes",
            "tlog_checkpoints",
            "tlog_cosignatures",
            "tlog_state",
        )
    ),
    "DELETE FROM affidavit_schema_migrations WHERE version = 10",
]
# the recorded claims (migration 11, both backends)
_UNDO_11 = [
    "DROP TABLE claims",
    "DELETE FROM affidavit_schema_migrations WHERE version = 11",
]
_UNDO_7 = [
    "ALTER TABLE jobs DROP COLUMN recoveries",
    "ALTER TABLE jobs DROP COLUMN recovery_progress",
    "DELETE FROM affidavit_schema_migrations WHERE version = 7",
]


# seals v2 (migration 12, both backends): every seal re-signed as v1 first (see undo_migration_12)
_UNDO_12 = [
    "ALTER TABLE seals DROP COLUMN version",
    "ALTER TABLE seals DROP COLUMN events_root",
    "DELETE FROM affidavit_schema_migrations WHERE version = 12",
]


def undo_migration_13(url: str) -> None:
    """Turn the database at ``url`` back into a version-12 one: no guard on the log's leaves
    and logged seals, no table of refused leaves."""
    from tests.tlog.helpers import drop_guards

    drop_guards(url)
    raw = RawDb(url)
    if not url.startswith("sqlite:///"):
        raw.execute("DROP FUNCTION affidavit_tlog_one_per_job()")
        raw.execute("DROP FUNCTION affidavit_logged_seal_fixed()")
    raw.execute("DROP TABLE tlog_rejected")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 13")


_UNDO_17_SQLITE = [
    "DROP TRIGGER tool_invocations_cancel_insert",
    "DROP TRIGGER tool_invocations_cancel_restart",
    "DROP TRIGGER jobs_cancel_requested",
]
_UNDO_17_POSTGRES = [
    "DROP TRIGGER tool_invocations_cancel_insert ON tool_invocations",
    "DROP TRIGGER tool_invocations_cancel_restart ON tool_invocations",
    "DROP TRIGGER jobs_cancel_requested ON jobs",
    "DROP FUNCTION affidavit_cancel_requested()",
]


# queues (migration 18, both backends)
_UNDO_18 = [
    "DROP INDEX jobs_queue",
    "DROP INDEX jobs_queue_partition",
    "DROP TABLE queue_grants",
    "DROP TABLE queues",
    *(
        f"ALTER TABLE jobs DROP COLUMN {c}"
        for c in ("queue", "priority", "partition_key", "not_before")
    ),
    "DELETE FROM affidavit_schema_migrations WHERE version = 18",
]


def undo_migration_18(url: str) -> None:
    """Take the queues (migration 18) out of the database at ``url``."""
    raw = RawDb(url)
    for statement in _UNDO_18:
        raw.execute(statement)


def undo_migration_19(url: str) -> None:
    """Take the tool limits (migration 19) out of the database at ``url``."""
    raw = RawDb(url)
    for statement in ("DROP TABLE limit_grants", "DROP TABLE limit_state"):
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 19")


def undo_migration_17(url: str) -> None:
    """Take the cancel requests (migration 17) out of the database at ``url`` (the later
    migrations undone first)."""
    undo_migration_19(url)
    undo_migration_18(url)
    raw = RawDb(url)
    triggers = _UNDO_17_SQLITE if url.startswith("sqlite:///") else _UNDO_17_POSTGRES
    for statement in (*triggers, "DROP TABLE cancel_requests"):
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 17")


def undo_migration_21(url: str) -> None:
    """Take the recorded ends of queue grants (migration 21) out of the database at ``url``."""
    raw = RawDb(url)
    if url.startswith("sqlite:///"):
        trigger = ("DROP TRIGGER queue_grant_end",)
    else:
        trigger = (
            "DROP TRIGGER queue_grant_end ON jobs",
            "DROP FUNCTION affidavit_queue_grant_end()",
        )
    for statement in (
        *trigger,
        "ALTER TABLE queue_grants DROP COLUMN ended_as",
        "ALTER TABLE queue_grants DROP COLUMN ended_at",
    ):
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 21")


def undo_migration_20(url: str) -> None:
    """Take the schedules (migration 20) out of the database at ``url``."""
    raw = RawDb(url)
    for statement in ("DROP TABLE schedules", "DROP TABLE scheduler_state"):
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 20")


def undo_migration_27(url: str) -> None:
    """Take the database-clock start of queue holds (migration 27) out of the database."""
    raw = RawDb(url)
    raw.execute("ALTER TABLE queue_grants DROP COLUMN held_from")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 27")


def undo_migration_25(url: str) -> None:
    """Take the tags and retention tables (migration 25) out of the database at ``url``."""
    raw = RawDb(url)
    for table in ("retention_holds", "retention_policy", "archived_jobs", "job_tags"):
        raw.execute(f"DROP TABLE {table}")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 25")


def undo_migration_24(url: str) -> None:
    """Take the data subjects (migration 24) out of the database at ``url``."""
    raw = RawDb(url)
    for table in ("job_subjects", "subject_keys", "subjects"):
        raw.execute(f"DROP TABLE {table}")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 24")


def undo_migration_23(url: str) -> None:
    """Take the child-job links (migration 23) out of the database at ``url``."""
    raw = RawDb(url)
    raw.execute("DROP TABLE job_children")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 23")


def undo_migration_22(url: str) -> None:
    """Take the limit waits (migration 22) out of the database at ``url``."""
    raw = RawDb(url)
    raw.execute("DROP TABLE limit_waits")
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 22")


# claim outcomes and trust-log seals (migration 15, both backends)
_UNDO_15 = [
    "DROP TABLE claim_outcomes",
    "DROP TABLE trust_seals",
    "DELETE FROM affidavit_schema_migrations WHERE version = 15",
]


def undo_migration_12(url: str) -> None:
    """Turn the database at ``url`` back into a version-11 one: its seals as that release
    signed them (v1: no events root), the two seal columns gone (the later migrations undone
    first)."""
    undo_migration_27(url)
    undo_migration_25(url)
    undo_migration_24(url)
    undo_migration_23(url)
    undo_migration_22(url)
    undo_migration_21(url)
    undo_migration_20(url)
    undo_migration_17(url)
    for statement in _UNDO_15:
        RawDb(url).execute(statement)
    undo_migration_13(url)
    raw = RawDb(url)
    for (job_id,) in raw.rows("SELECT job_id FROM seals WHERE version = 2"):
        reseal_v1(url, job_id)
    for statement in _UNDO_12:
        raw.execute(statement)


def undo_migration_6(url: str) -> None:
    """Turn the database at ``url`` (closed by every store) back into a version-5 one (the
    later migrations undone first)."""
    undo_migration_12(url)
    raw = RawDb(url)
    later = () if url.startswith("sqlite:///") else tuple(_UNDO_9_POSTGRES)
    for statement in (*_UNDO_11, *_UNDO_10, *later, *_UNDO_8, *_UNDO_7):
        raw.execute(statement)
    for statement in _SQLITE if url.startswith("sqlite:///") else _POSTGRES:
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 6")
