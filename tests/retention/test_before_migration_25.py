"""A copy made before migration 25 (no tags, no retention tables), opened read-only as an auditor
does: it is read as it is — listed, shown, verified — with no tags and nothing archived."""

from __future__ import annotations

from pathlib import Path

from affidavit.retention import check_archived, read_policy
from affidavit.store import open_store
from affidavit.store.tags import read_tags
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, json_of
from tests.retention.helpers import finished_jobs
from tests.store.legacy import undo_migration_25


def test_a_copy_before_migration_25_reads_as_it_is(store_url: str, tmp_path: Path) -> None:
    (job_id,) = finished_jobs(store_url, 1, tags={"plan": "gold"})
    undo_migration_25(store_url)
    store = open_store(store_url, read_only=True)
    try:
        assert store.schema_version() == 27 and not store.retention_tables
        assert verify_job(store, job_id).ok
        assert read_tags(store, [job_id]) == {}
        assert read_policy(store) is None and check_archived(store, job_id) is None
    finally:
        store.close()
    listed = cli("jobs", "list", "--db", store_url, "--json")
    assert listed.returncode == 0 and [j["job_id"] for j in json_of(listed)] == [job_id]
    assert cli("jobs", "show", job_id, "--db", store_url, "--json").returncode == 0
    every = cli("verify", "--all", "--db", store_url, "--json")
    assert every.returncode == 0 and json_of(every)["failed"] == 0
    assert cli("verify", job_id, "--db", store_url).returncode == 0
    shown = cli("retention", "show", "--db", store_url, "--json")
    assert shown.returncode == 0 and json_of(shown)["policy"] is None
