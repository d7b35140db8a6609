"""A job retention removed, over the API and the client, on both backends: its routes answer
404 ``job_archived`` naming where its pack went — to keys that see its namespace; another
namespace's key gets the plain ``job_not_found``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from affidavit import JobNotFound
from affidavit.client import ApiError
from affidavit.retention import Retention, set_policy
from affidavit.tlog import LogKey, Sequencer, default_log_key_path
from tests.api.conftest import Api
from tests.client.helpers import client

ONE_TOOL: dict[str, Any] = {"nodes": [{"id": "a", "type": "tool", "tool": "act"}]}


def test_an_archived_job_says_where_its_pack_is(api: Api, tmp_path: Path) -> None:
    job_id = api.runtime.submit(ONE_TOOL, {}, namespace="a").job_id
    assert api.runtime.run_job(job_id).status == "completed"
    Sequencer(api.store, LogKey(default_log_key_path(api.store.url))).integrate()
    set_policy(api.store, 0, tmp_path)
    report = Retention(api.store, clock=lambda: time.time() + 10 * 86_400).run()
    assert job_id in report.archived
    with client(api, "observer_a") as c:
        for read in (c.get, c.verify, c.trace):
            with pytest.raises(ApiError) as caught:
                read(job_id)
            assert caught.value.code == "job_archived" and caught.value.status == 404
            assert str(tmp_path / f"pack-{job_id}.tar.gz") in caught.value.message
        assert job_id not in {j.job_id for j in c.list(limit=1000).jobs}
    with client(api, "agent_b") as other, pytest.raises(JobNotFound):
        other.get(job_id)
