"""The migration runner applies what is missing, not what is above the highest version, and
splits scripts that contain trigger and function bodies."""

from __future__ import annotations

import pytest

from affidavit.core.errors import MigrationError
from affidavit.store import migrations, open_store
from affidavit.store.migrations import Migration


def test_a_migration_numbered_below_an_applied_one_still_runs(store_url: str) -> None:
    store = open_store(store_url)
    try:
        known = migrations.load("sqlite" if store.backend == "sqlite" else "postgres")
        applied = [m.version for m in known]
        # A later migration landing with a lower number than one already applied (a gap
        # filled in afterwards) is pending, not skipped.
        late = Migration(max(applied) - 1 if max(applied) - 1 not in applied else 99, "late", "")
        extended = sorted([*known, late], key=lambda m: m.version)
        assert migrations.pending(store.backend, applied, extended) == [late]
    finally:
        store.close()


def test_unknown_applied_versions_are_refused() -> None:
    known = [Migration(1, "a", ""), Migration(2, "b", ""), Migration(4, "d", "")]
    assert migrations.pending("sqlite", [1, 2], known) == [known[2]]
    with pytest.raises(MigrationError, match="newer than this affidavit"):
        migrations.pending("sqlite", [1, 2, 4, 7], known)
    with pytest.raises(MigrationError, match="does not know"):
        migrations.pending("sqlite", [1, 2, 3], known)


def test_statements_keep_trigger_and_function_bodies_whole() -> None:
    script = """
-- a comment; with a semicolon
CREATE TABLE t (x TEXT DEFAULT 'a;b');
CREATE TRIGGER t_guard BEFORE UPDATE ON t
BEGIN
    SELECT CASE WHEN 1 THEN RAISE(ABORT, 'no; never') END;
END;
CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stop';
END;
$$;
CREATE INDEX t_x ON t (x)
"""
    parts = Migration(1, "x", script).statements()
    assert len(parts) == 4
    assert parts[0] == "CREATE TABLE t (x TEXT DEFAULT 'a;b')"
    assert parts[1].startswith("CREATE TRIGGER") and parts[1].endswith("END")
    assert parts[2].startswith("CREATE FUNCTION") and parts[2].endswith("$$")
    assert parts[3] == "CREATE INDEX t_x ON t (x)"
