"""A witness following a served log over loopback HTTP; the operator who rewrites a job and
re-seals it with the real keys is caught by the witness, by `log verify --witness-key` and by
the job's old tlog-proof. Both backends, real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from affidavit.record._sealing import Sealer
from affidavit.store import open_store
from tests.cli.test_cli import cli, json_of
from tests.tlog import operator
from tests.tlog.helpers import drop_guards
from tests.tlog.test_log_cli import _jobs
from tests.verify.helpers import RawDb

ORIGIN = "test.example/log"
WITNESS = "witness.example/w1"


def _witness(state: Path, url: str, vkey: str, api_key: str) -> subprocess.CompletedProcess[str]:
    return cli("witness", "run", "--once", "--state", str(state), "--name", WITNESS,
               "--log-url", url, "--log-key", vkey, "--json",
               env={**os.environ, "AFFIDAVIT_WITNESS_API_KEY": api_key})  # fmt: skip


def test_witness_cosigns_and_catches_a_rewritten_log(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, api_key = served
    state = tmp_path / "witness"
    jobs = _jobs(store_url, 3)
    assert cli("log", "integrate", "--origin", ORIGIN, "--db", store_url).returncode == 0
    vkey = cli("log", "key", "--db", store_url).stdout.strip()
    wvkey = cli("witness", "key", "--state", str(state), "--name", WITNESS).stdout.strip()

    first = _witness(state, url, vkey, api_key)
    assert first.returncode == 0, first.stderr
    assert json_of(first) == {"cosigned": True, "size": 3, "origin": ORIGIN, "reason": ""}
    served_note = httpx.get(f"{url}/log/checkpoint").text
    assert f"— {WITNESS} " in served_note

    jobs += _jobs(store_url, 2)
    assert cli("log", "integrate", "--db", store_url).returncode == 0
    second = _witness(state, url, vkey, api_key)
    assert json_of(second)["cosigned"] is True and json_of(second)["size"] == 5

    auth = {"Authorization": f"Bearer {api_key}"}
    proof = httpx.get(f"{url}/api/jobs/{jobs[0]}/log-proof", headers=auth)
    assert proof.status_code == 200 and proof.text.startswith("c2sp.org/tlog-proof@v1\n")
    assert httpx.get(f"{url}/api/jobs/{jobs[0]}/log-proof").status_code == 401
    old_proof = tmp_path / "old.tlog-proof"
    old_proof.write_text(cli("log", "proof", jobs[0], "--db", store_url).stdout)
    ok = cli("log", "verify", str(old_proof), "--key", vkey, "--witness-key", wvkey,
             "--job", jobs[0], "--db", store_url)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert WITNESS in ok.stdout

    # The operator rewrites job 0 (drops its last event), re-seals it with the real seal key,
    # and rebuilds the whole log with the real log key so that the new seal is "in the log"
    # (the store's guards dropped first).
    drop_guards(store_url)
    raw = RawDb(store_url)
    last = raw.rows("SELECT max(version) FROM events WHERE job_id = ?", (jobs[0],))[0][0]
    raw.execute("DELETE FROM events WHERE job_id = ? AND version = ?", (jobs[0], last))
    raw.execute("DELETE FROM seals WHERE job_id = ?", (jobs[0],))
    store = open_store(store_url)
    try:
        Sealer.for_store(store).seal_job(store, jobs[0])
    finally:
        store.close()
    operator.rebuild(store_url, jobs, ORIGIN)

    # (1) the witness refuses, reports the fork, keeps its state and the evidence
    forked = _witness(state, url, vkey, api_key)
    assert forked.returncode == 1, forked.stdout + forked.stderr
    assert json_of(forked)["error"]["code"] == "fork_detected"
    assert "two roots for size 5" in json_of(forked)["error"]["message"]
    assert json.loads((state / "state.json").read_text())["size"] == 5
    (evidence,) = state.glob("fork-*.json")
    assert ORIGIN in json.loads(evidence.read_text())["offending_checkpoint"]

    # (2) a proof from the rewritten log has no cosignature of the witness
    new_proof = tmp_path / "new.tlog-proof"
    new_proof.write_text(cli("log", "proof", jobs[0], "--db", store_url).stdout)
    assert cli("log", "verify", str(new_proof), "--key", vkey).returncode == 0  # the log alone
    caught = cli("log", "verify", str(new_proof), "--key", vkey, "--witness-key", wvkey)
    assert caught.returncode == 1 and "witness" in caught.stderr

    # (3) the job's old proof no longer matches the job
    stale = cli("log", "verify", str(old_proof), "--key", vkey, "--witness-key", wvkey,
                "--job", jobs[0], "--db", store_url)  # fmt: skip
    assert stale.returncode == 1 and "not the job's seal" in stale.stderr


def test_tiles_over_http(store_url: str, served: tuple[str, str]) -> None:
    url, _ = served
    _jobs(store_url, 2)
    assert cli("log", "integrate", "--db", store_url).returncode == 0
    tile = httpx.get(f"{url}/log/tile/0/000.p/2")
    assert tile.status_code == 200 and len(tile.content) == 64
    assert tile.headers["content-type"] == "application/octet-stream"
    assert httpx.get(f"{url}/log/tile/0/000").status_code == 404
    assert httpx.get(f"{url}/log/tile/0/0").status_code == 400
    bundle = httpx.get(f"{url}/log/tile/entries/000.p/2").content
    n = int.from_bytes(bundle[:2], "big")
    assert json.loads(bundle[2 : 2 + n])["type"] == "affidavit.seal/v1"
    cons = httpx.get(f"{url}/log/consistency", params={"old": 1, "new": 2}).json()
    assert cons["old_size"] == 1 and len(cons["proof"]) == 1
    assert httpx.get(f"{url}/log/consistency", params={"old": 2, "new": 9}).status_code == 400
    refused = httpx.post(f"{url}/log/cosignatures", json={"checkpoint": "x", "witness_vkey": "y"})
    assert refused.status_code == 401
