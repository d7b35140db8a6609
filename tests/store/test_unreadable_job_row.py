"""A job row whose output or error column holds text that is not JSON (edited outside the
store) is still read: that field is reported unreadable, the rest of the job is as stored; a
sound job reads exactly as before. On both backends."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from affidavit import Runtime
from affidavit.examples import refund
from affidavit.store import JobFilter
from affidavit.verify import verify_job
from tests.verify.helpers import RawDb, refund_job

NOT_JSON = ["x", "{'total': 1}", '{"total": ', "NaN", "[" * 100_000, "", '"\\ud800"']


@pytest.mark.parametrize("text", NOT_JSON, ids=range(len(NOT_JSON)))
def test_an_output_that_is_not_json_is_reported_unreadable(
    store_url: str, tmp_path: Path, text: str
) -> None:
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        job_id = refund_job(rt, tmp_path / "shop")
        sound = rt.store.get_job(job_id)
        assert sound.unreadable == () and "unreadable" not in sound.to_dict()
        RawDb(store_url).execute("UPDATE jobs SET output = ? WHERE job_id = ?", (text, job_id))

        job = rt.store.get_job(job_id)
        assert job.output is None and job.unreadable == ("output",)
        doc = job.to_dict()
        json.dumps(doc, allow_nan=False)
        reason = doc["unreadable"]["output"]
        assert "not JSON" in reason and f"affidavit verify {job_id}" in reason
        assert doc["output"] is None and doc["status"] == "completed"
        assert {k: v for k, v in doc.items() if k not in ("output", "unreadable")} == {
            k: v for k, v in sound.to_dict().items() if k != "output"
        }
        (listed,) = rt.store.list_jobs(JobFilter())
        assert listed == job
        with rt.store.snapshot() as snap:
            assert snap.get_job(job_id) == job
        assert rt.get_job(job_id) == job
        assert not verify_job(rt.store, job_id).ok  # the edit itself is caught


def test_an_error_that_is_not_json_is_reported_unreadable(store_url: str) -> None:
    with Runtime(store_url) as rt:
        job, _ = rt.store.create_job(plan_name="p")
        with rt.store.transaction() as tx:
            tx.update_job(job.job_id, status="failed", error={"message": "boom"})
        RawDb(store_url).execute(
            "UPDATE jobs SET error = ?, output = ? WHERE job_id = ?", ("boom", "{", job.job_id)
        )
        read = rt.store.get_job(job.job_id)
        assert (read.output, read.error, read.unreadable) == (None, None, ("output", "error"))
        assert set(read.to_dict()["unreadable"]) == {"output", "error"}
        # a write over the row still works, and writes JSON again
        with rt.store.transaction() as tx:
            updated = tx.update_job(job.job_id, error={"message": "again"})
        assert updated.error == {"message": "again"} and updated.unreadable == ("output",)
        assert rt.store.get_job(job.job_id).unreadable == ("output",)


def test_an_output_that_is_not_utf8_is_reported_unreadable(store_url: str, tmp_path: Path) -> None:
    """SQLite keeps whatever bytes a TEXT column is given; reading the job failed as a store
    error (every `jobs show`, `jobs list`, API read of it). PostgreSQL refuses such text."""
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        job_id = refund_job(rt, tmp_path / "shop")
        sound = rt.store.get_job(job_id)
        raw = RawDb(store_url)
        if store_url.startswith("postgresql"):
            with pytest.raises(psycopg.errors.CharacterNotInRepertoire):
                raw.execute(
                    "UPDATE jobs SET output = convert_from('\\x7bff7d'::bytea, 'UTF8') "
                    "WHERE job_id = ?",
                    (job_id,),
                )
            return
        raw.execute(
            "UPDATE jobs SET output = CAST(? AS TEXT) WHERE job_id = ?", (b'{"a": "\xff"}', job_id)
        )
        job = rt.store.get_job(job_id)
        assert job.output is None and job.unreadable == ("output",)
        assert "not JSON" in job.to_dict()["unreadable"]["output"]
        assert job.to_dict()["status"] == sound.to_dict()["status"] == "completed"
        (listed,) = rt.store.list_jobs(JobFilter())
        assert listed == job
        with rt.store.snapshot() as snap:
            assert snap.get_job(job_id) == job
        assert not verify_job(rt.store, job_id).ok
