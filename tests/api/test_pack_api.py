"""``GET /api/jobs/{id}/pack`` over real HTTP on both backends, and the whole flow: submit over
HTTP, run, verify, download the pack, `affidavit pack verify` it offline (MATCH)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.claims import ClaimService
from affidavit.faces.ratelimit import RateLimit
from affidavit.store import open_store
from tests.api.conftest import TOOLS, Api, Server, make_keys
from tests.api.test_verify_api import finished_job
from tests.packs.helpers import assay_verify
from tests.verify.helpers import RawDb

AFFIDAVIT = Path(sys.executable).parent / "affidavit"
PLAN = {
    "name": "api-pack",
    "nodes": [
        {"id": "a", "type": "tool", "tool": "act", "args": {"x": "${input.x}"}},
        {"id": "t", "type": "pure", "tool": "think", "args": {"a": "${a}"}, "depends_on": ["a"]},
    ],
}


@pytest.fixture
def pack_api(store_url: str) -> Iterator[Api]:
    # function-scoped: the server signs packs with the seal key of this test's runtime
    store = open_store(store_url)
    keys = make_keys(store)
    app = create_app(store, tools=TOOLS, rate_limit=RateLimit(100_000, 1))
    with Server(app) as url, Runtime(store_url, tools=TOOLS) as rt:
        yield Api(url, store, rt, keys)
    store.close()


TOOLS_MODULE = """
from affidavit import pure, tool

@tool("act")
def act(ctx, **args):
    return {"did": ctx.node_id, "args": args}

@pure("think")
def think(ctx, **args):
    return {"thought": args}
"""


def test_submit_run_verify_download_and_verify_offline(pack_api: Api, tmp_path: Path) -> None:
    with pack_api.client("agent_a") as c:
        created = c.post("/api/jobs", json={"plan": PLAN, "input": {"x": 3}})
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
    # a real worker process runs it (same database, same seal key from the environment)
    tools = tmp_path / "pack_api_tools.py"
    tools.write_text(TOOLS_MODULE)
    worker = subprocess.run(
        [str(AFFIDAVIT), "worker", "--tools", str(tools), "--until-idle",
         "--db", pack_api.store.url, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout) == {"jobs_run": 1}
    with pack_api.client("observer_a") as c:
        assert c.get(f"/api/jobs/{job_id}/verify").json()["ok"] is True
        response = c.get(f"/api/jobs/{job_id}/pack")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    assert "x-affidavit-assay-diverging-count" not in response.headers
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    pack = tmp_path / f"pack-{job_id}"
    assert (pack / "pack_manifest.json").is_file()
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(AFFIDAVIT), "pack", "verify", str(pack), "--out-dir", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "MATCH"
    code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt["verdict"]) == (0, "MATCH")


def test_pack_endpoint_errors(pack_api: Api) -> None:
    waiting = pack_api.waiting_job("a")
    with pack_api.client("observer_a") as c:
        unfinished = c.get(f"/api/jobs/{waiting}/pack")
        assert unfinished.status_code == 409
        assert unfinished.json()["error"]["code"] == "job_not_finished"
        assert c.get("/api/jobs/no-such-job/pack").status_code == 404
    with pack_api.client("agent_b") as c:  # another namespace's job does not exist for b
        assert c.get(f"/api/jobs/{waiting}/pack").status_code == 404
    with pack_api.client(None) as c:
        assert c.get(f"/api/jobs/{waiting}/pack").status_code == 401


def test_pack_of_a_job_that_does_not_verify_is_409(pack_api: Api) -> None:
    """A finished job whose record does not verify is refused as a state the job is in (409,
    the error body), like an unfinished one — not as a malformed request."""
    job = pack_api.runtime.submit(PLAN, {"x": 1}, namespace="a")
    pack_api.runtime.run_job(job.job_id)
    assert pack_api.runtime.get_job(job.job_id).status == "completed"
    RawDb(pack_api.store.url).execute("DELETE FROM seals WHERE job_id = ?", (job.job_id,))
    with pack_api.client("observer_a") as c:
        refused = c.get(f"/api/jobs/{job.job_id}/pack")
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "pack_error"
        assert "does not verify" in refused.json()["error"]["message"]


def test_pack_that_assay_reports_diverging_says_so_in_headers(
    pack_api: Api, tmp_path: Path
) -> None:
    """A trace holding an exponent-form number (1e-7), which assay's verifier canonicalizes
    otherwise than RFC 8785: the download names the steps assay will report as diverging, as
    `affidavit pack export` does on stderr."""
    job = pack_api.runtime.submit(PLAN, {"x": 1e-7}, namespace="a")
    pack_api.runtime.run_job(job.job_id)
    with pack_api.client("observer_a") as c:
        response = c.get(f"/api/jobs/{job.job_id}/pack")
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    _, receipt, _ = assay_verify(tmp_path / f"pack-{job.job_id}", tmp_path / "assay-out")
    assert receipt["verdict"] == "DIVERGE"
    steps = receipt["divergent_step_ids"]
    assert response.headers["x-affidavit-assay-diverging-count"] == str(len(steps))
    assert response.headers["x-affidavit-assay-diverging-steps"].split(",") == steps


def test_readers_answer_a_row_edited_into_another_type_with_409(pack_api: Api) -> None:
    """SQLite: a payload stored as text (`UPDATE ... SET payload = CAST(payload AS TEXT)` in the
    sqlite3 shell) — every endpoint that reads the row answers the JSON error naming the job
    and version (409, as a log that does not replay), never a 500; a trust log entry or an
    evidence record likewise names the agent and the entry."""
    raw = RawDb(pack_api.store.url)
    if not raw.url.startswith("sqlite:///"):
        pytest.skip("PostgreSQL's typed columns refuse the edit (see test_tampered_rows_cli)")
    job_id = finished_job(pack_api)
    version = raw.events(job_id)[2][0]
    raw.execute(
        "UPDATE events SET payload = CAST(payload AS TEXT) WHERE job_id = ? AND version = ?",
        (job_id, version),
    )
    message = f"job {job_id}, event {version}: the payload is stored as text, not bytes"
    with pack_api.client("observer_a") as c:
        for path in ("events", "trace", "pack"):
            response = c.get(f"/api/jobs/{job_id}/{path}")
            assert response.status_code == 409, (path, response.text)
            assert response.json()["error"]["message"] == message
        assert c.get(f"/api/jobs/{job_id}/verify").json()["ok"] is False

    svc = ClaimService(pack_api.store)
    svc.add_agent("api-alice", namespace="a", role="agent")
    svc.add_agent("api-vera", namespace="a", role="agent")
    svc.verify_claim("api-alice", "custom", {"return_code": 0}, "true", "api-vera")
    raw.execute("DROP TRIGGER trust_log_no_update")
    raw.execute("DROP TRIGGER claim_verifications_no_update")
    raw.execute("UPDATE trust_log SET payload = CAST(payload AS TEXT) WHERE agent_id = 'api-alice'")
    raw.execute(
        "UPDATE claim_verifications SET evidence = CAST(evidence AS TEXT) "
        "WHERE agent_id = 'api-alice'"
    )
    with pack_api.client("observer_a") as c:
        history = c.get("/api/agents/api-alice/trust-history")
        assert history.status_code == 409
        assert history.json()["error"] == {
            "code": "record_tampered",
            "message": "agent api-alice, trust log entry 1: the payload is stored as text, "
            "not bytes",
            "hint": history.json()["error"]["hint"],
        }
        evidence = c.get("/api/agents/api-alice/verifications")
        assert evidence.status_code == 409
        assert evidence.json()["error"]["code"] == "record_tampered"
