"""The store's public contract: the names ``affidavit.store`` exports, the layers above it
importing only those, and the backend-answered fallback for text a database cannot decode."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import affidavit.store
from affidavit.core.errors import StoreError
from affidavit.store import NewEvent, Store, connect_raw, postgres_conninfo

SRC = Path(affidavit.store.__file__).resolve().parent.parent


def test_the_public_names_of_the_store() -> None:
    assert sorted(affidavit.store.__all__) == sorted(
        [
            "JOB_STATUSES",
            "SUPPORTED_SCHEMES",
            "TERMINAL_STATUSES",
            "ApiKeyRow",
            "CancelRequest",
            "ClaimOutcome",
            "Claimed",
            "ClockOffset",
            "Encoded",
            "JobFilter",
            "JobRecord",
            "LedgerColumns",
            "LedgerRow",
            "LogLeaf",
            "NewEvent",
            "NewJob",
            "NextClaim",
            "QueuedLeaf",
            "RejectedLeaf",
            "RowReader",
            "SealKeyAdmission",
            "Snapshot",
            "Store",
            "StoredEvent",
            "SubjectKeys",
            "SubjectRow",
            "Transaction",
            "connect_raw",
            "database_file",
            "forged_copy",
            "open_store",
            "postgres_conninfo",
            "sqlite_path",
            "trust_record_id",
            "unmatchable",
            "url_backend",
        ]
    )
    for name in affidavit.store.__all__:
        assert getattr(affidavit.store, name) is not None


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_no_layer_above_the_store_imports_a_private_or_backend_store_module() -> None:
    """Everything outside ``affidavit/store/`` asks ``affidavit.store`` for public names: a
    backend's quirks are answered by the backend, behind the protocol."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "store" and path.parent.parent == SRC:
            continue
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[:2] == ["affidavit", "store"] and len(parts) > 2:
                inner = parts[2]
                if inner.startswith("_") or inner in ("sqlite", "postgres"):
                    offenders.append(f"{path.relative_to(SRC)}: {module}")
    assert offenders == []


def test_text_fallback_reads_once_when_the_read_succeeds(store: Store) -> None:
    calls: list[bool] = []

    def read(lenient: bool) -> int:
        calls.append(lenient)
        return 7

    assert store.with_text_fallback(read) == 7
    assert calls == [False]


def test_text_fallback_reads_leniently_only_after_text_the_database_cannot_decode(
    store: Store,
) -> None:
    """A job type edited to bytes that are not UTF-8 (possible only in SQLite, whose TEXT is
    not checked) fails the strict read; the store reads again leniently. PostgreSQL refuses
    such text on write, so there the first read is the answer, and any other StoreError is
    raised as it is on both backends."""
    job, _ = store.create_job(events=[NewEvent("job_created", {})])
    if store.backend == "sqlite":
        with connect_raw(store.url.removeprefix("sqlite:///")) as raw:
            raw.execute(
                "UPDATE events SET type = CAST(x'ff41' AS TEXT) WHERE job_id = ?", (job.job_id,)
            )
    calls: list[bool] = []

    def read(lenient: bool) -> list[str]:
        calls.append(lenient)
        with store.snapshot(lenient_text=lenient) as snap:
            return [row[2] for row in snap.iter_event_rows(job.job_id)]

    types = store.with_text_fallback(read)
    if store.backend == "sqlite":
        assert calls == [False, True]
        assert types == ["\udcffA"]
    else:
        assert calls == [False]
        assert types == ["job_created"]

    def fails(lenient: bool) -> None:
        calls.append(lenient)
        raise StoreError("the database is gone")

    calls.clear()
    with pytest.raises(StoreError, match="gone"):
        store.with_text_fallback(fails)
    assert calls == [False]


def test_postgres_conninfo_drops_only_the_parameters_affidavit_reads() -> None:
    conninfo, schema = postgres_conninfo(
        "postgresql://u@h:5433/db?schema=s1&pool_size=4&sslmode=disable&pool_timeout=2"
    )
    assert conninfo == "postgresql://u@h:5433/db?sslmode=disable"
    assert schema == "s1"
    assert postgres_conninfo("postgresql://u@h/db") == ("postgresql://u@h/db", None)
