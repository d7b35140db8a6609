"""The migrated databases the tests are given (tests/migrated.py) are what migrating anew
makes: a PostgreSQL schema given back after a test that wrote to every kind of table is, to the
next test, a freshly migrated schema (definition, rows, sequences, statistics); a schema whose
definition a test changed is dropped, not lent again; a connection a test left open cannot
reach the schema once it is given back; a SQLite copy is a migrated database."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from affidavit.store import NewEvent, migrations, open_store
from tests.conftest import PG_URL, with_schema
from tests.migrated import PgSchemas, SqliteTemplate, drop, new_schema_name
from tests.store.test_read_only import finished_job

# What defines a schema, by name (no oid, no schema name): tables and their columns, indexes,
# constraints, triggers (and whether enabled), functions, sequences, privileges, options.
DEFINITION = """
SELECT 'column', concat_ws(' ', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
       pg_get_expr(d.adbin, d.adrelid), a.attnotnull)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE c.relnamespace = %(ns)s AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL SELECT 'relation', concat_ws(' ', c.relname, c.relkind, c.relacl, c.reloptions,
       c.relrowsecurity, c.relpersistence)
  FROM pg_class c WHERE c.relnamespace = %(ns)s AND c.relkind <> 't'
UNION ALL SELECT 'index', pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'constraint', concat_ws(' ', k.conname, pg_get_constraintdef(k.oid))
  FROM pg_constraint k WHERE k.connamespace = %(ns)s
UNION ALL SELECT 'trigger', concat_ws(' ', pg_get_triggerdef(t.oid), t.tgenabled)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  WHERE c.relnamespace = %(ns)s AND NOT t.tgisinternal  -- (those of the constraints)
UNION ALL SELECT 'function', concat_ws(' ', p.proname, md5(p.prosrc), p.proconfig)
  FROM pg_proc p WHERE p.pronamespace = %(ns)s
UNION ALL SELECT 'sequence', concat_ws(' ', c.relname, s.seqstart, s.seqincrement)
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = %(ns)s
UNION ALL SELECT 'schema', concat_ws(' ', n.nspacl) FROM pg_namespace n WHERE n.oid = %(ns)s
"""


@pytest.fixture
def schemas(pg_schema: str) -> Iterator[PgSchemas]:
    del pg_schema  # (PostgreSQL required, as for every test of the server)
    pool = PgSchemas(PG_URL)
    yield pool
    pool.close()


def _oid(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int:
    row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert row is not None, f"no schema {schema}"
    return int(str(row[0]))


def state(schema: str) -> dict[str, object]:
    """The schema as a test sees it: its definition (the schema's name taken out), every
    table's rows, every sequence's position, and what the planner knows of each table."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        ns = _oid(conn, schema)
        definition = sorted(
            (str(kind), re.sub(rf'"?{schema}"?\.', "", str(text)))
            for kind, text in conn.execute(DEFINITION, {"ns": ns})
        )
        tables = [
            str(r[0])
            for r in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = %s AND relkind = 'r'", (ns,)
            )
        ]
        rows = {}
        for table in tables:
            query = sql.SQL("SELECT r::text FROM {}.{} r ORDER BY 1").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            # (the time a migration was applied differs from one schema to the next)
            rows[table] = [
                re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "T", str(r[0])) for r in conn.execute(query)
            ]
        sequences = {
            str(name): conn.execute(
                sql.SQL("SELECT last_value, is_called FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(str(name))
                )
            ).fetchone()
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = %s AND relkind = 'S'", (ns,)
            )
        }
        planner = conn.execute(
            "SELECT c.relname, c.relpages, c.reltuples, "
            "(SELECT count(*) FROM pg_statistic s WHERE s.starelid = c.oid) "
            "FROM pg_class c WHERE c.relnamespace = %s AND c.relkind IN ('r', 'i') "
            "ORDER BY c.relname",
            (ns,),
        ).fetchall()
    return {"definition": definition, "rows": rows, "sequences": sequences, "planner": planner}


def fill(url: str) -> None:
    """Write to most of the store's tables: finished jobs (events, ledger, seals, keys), a
    transparency log, a claim's agent, a queue, a schedule's lease; then analyze them all, so
    that the planner knows their rows."""
    for _ in range(3):
        finished_job(url)
    store = open_store(url)
    try:
        with store.transaction() as tx:
            for n in range(200):
                job, _ = tx.create_job(status="completed")
                tx.append(job.job_id, [NewEvent("job_created", {"n": n})], expected_version=0)
            tx.execute(
                "INSERT INTO agents (agent_id, namespace, role, trust_score, verifications, "
                "accurate_verifications, error_verifications, created_at, updated_at) "
                "VALUES ('a', 'default', 'agent', 0.5, 0, 0, 0, 'x', 'x')"
            )
            tx.execute("INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES ('j', 'l', 0)")
            tx.execute("UPDATE tlog_state SET size = 7")
            tx.execute("UPDATE scheduler_state SET lease_owner = 'w'")
    finally:
        store.close()
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for (table,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall():
            conn.execute(
                sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
            )


def test_a_schema_given_back_is_a_freshly_migrated_one(schemas: PgSchemas) -> None:
    fresh = new_schema_name()
    open_store(with_schema(PG_URL, fresh)).close()
    try:
        migrated = state(fresh)
        lent = schemas.lend()
        assert state(lent) == migrated
        fill(with_schema(PG_URL, lent))
        used = state(lent)
        assert used["rows"] != migrated["rows"] and used["planner"] != migrated["planner"]
        schemas.give_back(lent)
        again = schemas.lend()
        assert again != lent  # (the same schema, under a new name)
        assert state(again) == migrated
        with psycopg.connect(PG_URL) as conn:
            assert (
                conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (lent,)).fetchone()
                is None
            )
        schemas.give_back(again)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            drop(conn, fresh)


@pytest.mark.parametrize(
    "change",
    [
        "DROP TRIGGER seals_logged_fixed ON seals",
        "ALTER TABLE seals DISABLE TRIGGER USER",
        "ALTER TABLE jobs ADD COLUMN extra TEXT",
        "CREATE TABLE extra (x TEXT)",
        "CREATE INDEX extra ON jobs (status, plan_name)",
        "ALTER TABLE jobs SET (fillfactor = 50)",
        "DROP TABLE trust_seals",
        "CREATE OR REPLACE FUNCTION affidavit_append_guard("
        "p_job_id TEXT, p_fence TEXT, p_version BIGINT, p_head TEXT) "
        "RETURNS VOID LANGUAGE sql AS $$ SELECT $$",
        "GRANT SELECT ON jobs TO PUBLIC",
    ],
)
def test_a_schema_whose_definition_a_test_changed_is_dropped(
    schemas: PgSchemas, change: str
) -> None:
    lent = schemas.lend()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(lent)))
        conn.execute(change)
        oid = _oid(conn, lent)
    schemas.give_back(lent)
    with psycopg.connect(PG_URL) as conn:
        gone = conn.execute("SELECT 1 FROM pg_namespace WHERE oid = %s", (oid,)).fetchone()
        assert gone is None
    again = schemas.lend()
    with psycopg.connect(PG_URL) as conn:
        assert _oid(conn, again) != oid
    schemas.give_back(again)


def test_a_connection_left_open_cannot_reach_the_schema_given_back(schemas: PgSchemas) -> None:
    lent = schemas.lend()
    store = open_store(with_schema(PG_URL, lent))  # (its statements are prepared)
    store.create_job(plan_name="before")
    with psycopg.connect(PG_URL, autocommit=True) as left:
        left.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(lent)))
        insert = "INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES ('j', 'l', 0)"
        left.execute(insert, prepare=True)
        schemas.give_back(lent)
        with pytest.raises(psycopg.errors.UndefinedTable):
            left.execute(insert, prepare=True)
        with pytest.raises(Exception, match="does not exist"):
            store.create_job(plan_name="after")
    store.close()
    again = schemas.lend()
    reopened = open_store(with_schema(PG_URL, again))
    try:
        assert reopened.list_jobs() == []
    finally:
        reopened.close()
        schemas.give_back(again)


def test_a_sqlite_copy_is_a_migrated_database(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    url = SqliteTemplate(tmp_path / "t").copy_to(tmp_path / "copy.db")
    store = open_store(url, migrate=False)
    try:
        assert store.schema_version() == migrations.load("sqlite")[-1].version
        assert store.list_jobs() == []
    finally:
        store.close()
