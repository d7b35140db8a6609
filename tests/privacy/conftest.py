from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.core.approvals import Principal
from affidavit.core.privacy import FileKeyProvider
from tests.privacy import subject_tools as st

ALICE = Principal("alice", "approver", "k-alice")


@pytest.fixture
def master_key(tmp_path: Path) -> Path:
    path = tmp_path / "master.key"
    FileKeyProvider.create(path)
    return path


@pytest.fixture
def rt(store_url: str, master_key: Path) -> Iterator[Runtime]:
    with Runtime(store_url, tools=st.registry(), master_key=master_key) as runtime:
        yield runtime


def run_everything(rt: Runtime, subject: str | None = "customer-7") -> str:
    """A ``pv_everything`` job run to its end: a signal and an approval with canaries."""
    job = rt.submit("pv_everything", {"email": st.CANARY}, subject=subject)
    assert rt.run_job(job.job_id).status == "waiting"
    rt.signal(job.job_id, "details", {"note": f"call {st.CANARY}"})
    assert rt.run_job(job.job_id).status == "waiting"
    rt.signal(
        job.job_id,
        "send_summary",
        {"approved": True, "comment": f"ok for {st.CANARY}"},
        approver=ALICE,
    )
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    return job.job_id
