"""Migrated databases for the tests, made once per test process and copied per test.

A store test used to migrate a database of its own: every migration, each time, ~0.1 s of
server DDL on PostgreSQL and 30-200 ms of writes on SQLite, for a few thousand tests. Here the
migrations run once per test process (each xdist worker); a test is then given:

- SQLite: a byte copy of a migrated file (closed, so its write-ahead log is checkpointed into
  it), at the path its own empty database had.
- PostgreSQL: a schema migrated once and given back after each test with nothing of that test
  left in it. A schema has no cheap copy (replaying a dump costs as much DDL as migrating), so
  the one schema is reused, and ``give_back`` makes it what migrating anew would: in one
  transaction it (1) renames the schema, so a connection or process the test left behind can
  no longer find its tables (a cached plan is re-planned against the search path, which names
  a schema that is gone), (2) locks every table (a writer still inside a statement finishes
  first), (3) compares the schema's catalog rows with those it had when it was migrated (a
  test that dropped a trigger, altered a table, granted a role or ran a migration backwards
  changed one of them: the schema is then dropped, not reused), and (4) empties the tables
  that are not as migrated (``TRUNCATE``, which gives them new, empty files: no dead rows,
  no statistics) and writes back the rows the migrations seeded; the sequences, the sizes the
  planner reads from ``pg_class``, the tables' statistics and their activity counters (which
  start autovacuum) are set back as well.

Tests of the migrations themselves ask for ``empty_store_url`` (tests/conftest.py), whose
database is empty as before.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from affidavit.store import open_store

# How long giving a schema back waits for a lock held by what the test left running; then the
# schema is dropped instead (as every schema was before).
_LOCK_TIMEOUT = "5s"

# The catalog rows that make up a schema's definition. A row's ``xmin`` changes with any
# change to it, so these are compared as (oid, xmin); ``pg_class`` rows also change when a
# table is truncated, vacuumed or analyzed (its file and size columns), so they are compared
# by the columns that define the relation.
_FINGERPRINT = """
WITH rels AS (SELECT oid FROM pg_class WHERE relnamespace = %(ns)s)
SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
  SELECT concat_ws('|', 'n', n.nspowner, n.nspacl) AS x
    FROM pg_namespace n WHERE n.oid = %(ns)s
  UNION ALL SELECT concat_ws('|', 'c', c.oid, c.relname, c.reltype, c.relowner, c.relam,
      c.reltablespace, c.reltoastrelid, c.relpersistence, c.relkind, c.relnatts, c.relchecks,
      c.relhasrules, c.relhastriggers, c.relrowsecurity, c.relforcerowsecurity,
      c.relreplident, c.relispartition, c.relacl, c.reloptions)
    FROM pg_class c WHERE c.relnamespace = %(ns)s
  UNION ALL SELECT concat_ws('|', 'a', a.attrelid, a.attnum, a.xmin)
    FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 't', t.oid, t.xmin)
    FROM pg_trigger t WHERE t.tgrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'i', i.indexrelid, i.xmin)
    FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'd', d.oid, d.xmin)
    FROM pg_attrdef d WHERE d.adrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'r', r.oid, r.xmin)
    FROM pg_rewrite r WHERE r.ev_class IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'y', y.oid, y.xmin)
    FROM pg_policy y WHERE y.polrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'q', q.seqrelid, q.xmin)
    FROM pg_sequence q WHERE q.seqrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT concat_ws('|', 'k', k.oid, k.xmin)
    FROM pg_constraint k WHERE k.connamespace = %(ns)s
  UNION ALL SELECT concat_ws('|', 'p', p.oid, p.xmin)
    FROM pg_proc p WHERE p.pronamespace = %(ns)s
  UNION ALL SELECT concat_ws('|', 'T', y.oid, y.xmin)
    FROM pg_type y WHERE y.typnamespace = %(ns)s
  UNION ALL SELECT concat_ws('|', 'D', d.oid, d.xmin)
    FROM pg_default_acl d WHERE d.defaclnamespace = %(ns)s
) parts
"""


def new_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


class SqliteTemplate:
    """A migrated SQLite file, copied for each test."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "migrated.db"
        open_store(f"sqlite:///{self.path}").close()
        if any(Path(f"{self.path}{suffix}").exists() for suffix in ("-wal", "-shm")):
            raise RuntimeError(f"{self.path}: closed with a write-ahead log left beside it")

    def copy_to(self, path: Path) -> str:
        """A migrated database at ``path``; its URL."""
        shutil.copyfile(self.path, path)
        return f"sqlite:///{path}"


class _Schema:
    """A migrated schema of the pool: its current name, its namespace's oid, the fingerprint
    of its definition as migrated."""

    def __init__(self, name: str, oid: int, fingerprint: str) -> None:
        self.name, self.oid, self.fingerprint = name, oid, fingerprint


class PgSchemas:
    """Migrated PostgreSQL schemas for one test process (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._admin = psycopg.connect(url, autocommit=True)
        self._free: list[_Schema] = []
        self._lent: dict[str, _Schema] = {}
        # The tables, the rows the migrations wrote (by table) and the sequences' state, as
        # migrated: learned from a schema migrated for that and kept untouched.
        self._model = self._migrated()
        self.reusable = self._superuser()  # (resetting statistics and the replica role need it)
        self._tables = self._names(
            "SELECT relname FROM pg_class WHERE relnamespace = %s "
            "AND relkind = 'r' ORDER BY relname"
        )
        self._sequences = self._names(
            "SELECT relname FROM pg_class WHERE relnamespace = %s "
            "AND relkind = 'S' ORDER BY relname"
        )
        self._seeded = [t for t in self._tables if self._has_rows(self._model.name, t)]
        # (a table is emptied with every table whose foreign keys point at it: TRUNCATE
        # refuses to empty a referenced table alone, rows or not)
        self._referrers: dict[str, set[str]] = {}
        for referenced, referrer in self._admin.execute(
            "SELECT confrelid::regclass::text, conrelid::regclass::text FROM pg_constraint "
            "WHERE contype = 'f' AND connamespace = %s",
            (self._model.oid,),
        ):
            self._referrers.setdefault(_bare(referenced), set()).add(_bare(referrer))
        self._sizes = [
            (str(name), int(pages), float(tuples), int(visible))
            for name, pages, tuples, visible in self._admin.execute(
                "SELECT relname, relpages, reltuples, relallvisible FROM pg_class "
                "WHERE relnamespace = %s",
                (self._model.oid,),
            )
        ]
        self._sequence_state = {
            s: self._admin.execute(
                sql.SQL("SELECT last_value, is_called FROM {}.{}").format(
                    sql.Identifier(self._model.name), sql.Identifier(s)
                )
            ).fetchone()
            for s in self._sequences
        }

    def _superuser(self) -> bool:
        row = self._admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        found = row.fetchone()
        return bool(found and found[0])

    def _names(self, query: str) -> list[str]:
        return [str(r[0]) for r in self._admin.execute(query, (self._model.oid,))]

    def _has_rows(self, schema: str, table: str) -> bool:
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.{})").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
        row = self._admin.execute(query).fetchone()
        return bool(row and row[0])

    def _migrated(self) -> _Schema:
        name = new_schema_name()
        open_store(f"{self._url}{'&' if '?' in self._url else '?'}schema={name}").close()
        row = self._admin.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (name,))
        found = row.fetchone()
        assert found is not None
        oid = int(found[0])
        return _Schema(name, oid, self._fingerprint(oid))

    def _fingerprint(self, oid: int) -> str:
        row = self._admin.execute(_FINGERPRINT, {"ns": oid}).fetchone()
        assert row is not None
        return str(row[0])

    def lend(self) -> str:
        """The name of a migrated schema with no rows but those the migrations wrote."""
        schema = self._free.pop() if self._free else self._migrated()
        self._lent[schema.name] = schema
        return schema.name

    def give_back(self, name: str) -> None:
        """End the loan of ``name``: the schema is reset for the next test, or dropped."""
        schema = self._lent.pop(name)
        if self.reusable and self._reset(schema):
            self._free.append(schema)
        else:
            drop(self._admin, schema.name)

    def _reset(self, schema: _Schema) -> bool:
        fresh = new_schema_name()
        ident = sql.Identifier(fresh)
        tables = sql.SQL(", ").join(
            sql.SQL("{}.{}").format(ident, sql.Identifier(t)) for t in self._tables
        )
        conn = self._admin
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
                # (1) and (2)
                conn.execute(
                    sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                        sql.Identifier(schema.name), ident
                    )
                )
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(tables))
                # (3)
                if self._fingerprint(schema.oid) != schema.fingerprint:
                    raise _Changed
                # (4)
                dirty = self._dirty(fresh)
                conn.execute("SET LOCAL session_replication_role = replica")  # (no triggers)
                if dirty:
                    conn.execute(
                        sql.SQL("TRUNCATE {}").format(
                            sql.SQL(", ").join(
                                sql.SQL("{}.{}").format(ident, sql.Identifier(t)) for t in dirty
                            )
                        )
                    )
                    for table in set(dirty) & set(self._seeded):
                        conn.execute(
                            sql.SQL(
                                "INSERT INTO {}.{} OVERRIDING SYSTEM VALUE SELECT * FROM {}.{}"
                            ).format(
                                ident,
                                sql.Identifier(table),
                                sql.Identifier(self._model.name),
                                sql.Identifier(table),
                            )
                        )
                for seq, (last, called) in self._sequence_state.items():
                    conn.execute(
                        "SELECT setval(%s::regclass, %s, %s)",
                        (f'"{fresh}"."{seq}"', last, called),
                    )
                names, pages, tuples, visible = zip(*self._sizes, strict=True)
                conn.execute(  # (as a catalog row, since the planner reads them)
                    "UPDATE pg_class c SET relpages = m.relpages, reltuples = m.reltuples, "
                    "relallvisible = m.relallvisible "
                    "FROM unnest(%s::text[], %s::int[], %s::real[], %s::int[]) "
                    "AS m (relname, relpages, reltuples, relallvisible) "
                    "WHERE c.relnamespace = %s AND m.relname = c.relname "
                    "AND (c.relpages, c.reltuples, c.relallvisible) "
                    "IS DISTINCT FROM (m.relpages, m.reltuples, m.relallvisible)",
                    (list(names), list(pages), list(tuples), list(visible), schema.oid),
                )
                conn.execute(
                    "DELETE FROM pg_statistic WHERE starelid IN "
                    "(SELECT oid FROM pg_class WHERE relnamespace = %s)",
                    (schema.oid,),
                )
                conn.execute(
                    "SELECT pg_stat_reset_single_table_counters(oid) FROM pg_class "
                    "WHERE relnamespace = %s AND relkind = 'r'",
                    (schema.oid,),
                )
        except (_Changed, psycopg.errors.LockNotAvailable):
            return False
        except psycopg.errors.UndefinedTable:  # (a table the test dropped)
            return False
        schema.name = fresh
        return True

    def _dirty(self, schema: str) -> list[str]:
        """The tables of ``schema`` whose rows are not those the migrations wrote, with the
        tables that refer to them."""
        ident = sql.Identifier(schema)
        model = sql.Identifier(self._model.name)
        checks = []
        for table in self._tables:
            name = sql.Identifier(table)
            if table in self._seeded:
                check = sql.SQL(
                    "(SELECT md5(string_agg(r::text, ',' ORDER BY r::text)) FROM {}.{} r) "
                    "IS DISTINCT FROM "
                    "(SELECT md5(string_agg(r::text, ',' ORDER BY r::text)) FROM {}.{} r)"
                ).format(ident, name, model, name)
            else:
                check = sql.SQL("EXISTS (SELECT 1 FROM {}.{})").format(ident, name)
            checks.append(sql.SQL("SELECT {} WHERE {}").format(sql.Literal(table), check))
        rows = self._admin.execute(sql.SQL(" UNION ALL ").join(checks)).fetchall()
        dirty = {str(r[0]) for r in rows}
        todo = list(dirty)
        while todo:
            for referrer in self._referrers.get(todo.pop(), ()):
                if referrer not in dirty:
                    dirty.add(referrer)
                    todo.append(referrer)
        return sorted(dirty)

    def close(self) -> None:
        for schema in [*self._free, *self._lent.values(), self._model]:
            with contextlib.suppress(psycopg.Error):
                drop(self._admin, schema.name)
        self._admin.close()


class _Changed(Exception):
    """The schema's definition is not as migrated (raised to roll the reset back)."""


def _bare(name: str) -> str:
    """A table's name without its schema (``regclass`` text qualifies it when the schema is
    not on the search path)."""
    return name.rsplit(".", 1)[-1].strip('"')


def drop(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
