"""`affidavit log ...` as a user runs it, on both backends: proofs that verify offline, and the
ones that must not."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from affidavit import Runtime
from affidavit.core.checkpoint import Checkpoint
from affidavit.core.merkle import verify_consistency
from affidavit.core.note import parse_note
from tests.cli.test_cli import cli, json_of
from tests.tlog.helpers import drop_guards
from tests.verify.helpers import TWO_CHARGES, RawDb, tools


def _jobs(url: str, n: int) -> list[str]:
    with Runtime(url, tools=tools()) as rt:
        ids = [rt.submit(TWO_CHARGES, {"amount": i + 1}).job_id for i in range(n)]
        rt.run_until_idle()
        assert all(rt.get_job(j).status == "completed" for j in ids)
    return ids


def test_proof_key_verify_round_trip(store_url: str, tmp_path: Path) -> None:
    jobs = _jobs(store_url, 3)
    queued = cli("log", "proof", jobs[0], "--db", store_url)
    assert queued.returncode == 2 and "queued" in queued.stderr

    done = cli("log", "integrate", "--origin", "test.example/log", "--db", store_url, "--json")
    assert done.returncode == 0, done.stderr
    assert json_of(done) == {
        "busy": False,
        "integrated": 3,
        "size": 3,
        "origin": "test.example/log",
        "rejected": [],
    }
    vkey = cli("log", "key", "--db", store_url).stdout.strip()
    assert vkey.startswith("test.example/log+")
    (tmp_path / "log.vkey").write_text(vkey + "\n")

    note = cli("log", "checkpoint", "--db", store_url).stdout
    cp = Checkpoint.from_text(parse_note(note).text)
    assert cp.size == 3

    proof = cli("log", "proof", jobs[1], "--db", store_url)
    assert proof.returncode == 0, proof.stderr
    assert proof.stdout.startswith("c2sp.org/tlog-proof@v1\nextra ")
    path = tmp_path / "job.tlog-proof"
    path.write_text(proof.stdout)

    ok = cli("log", "verify", str(path), "--key", str(tmp_path / "log.vkey"))
    assert ok.returncode == 0, ok.stderr
    assert f"job {jobs[1]}" in ok.stdout and "leaf 1 of test.example/log at size 3" in ok.stdout
    with_job = cli(
        "log", "verify", str(path), "--key", vkey, "--job", jobs[1], "--db", store_url, "--json"
    )
    assert with_job.returncode == 0 and json_of(with_job)["ok"] is True

    # another job's seal, a missing witness, a foreign log key: not verified
    other = cli("log", "verify", str(path), "--key", vkey, "--job", jobs[0], "--db", store_url)
    assert other.returncode == 1 and "not the job's seal" in other.stderr
    witness = "w.example+d2e8bc8c+BLUoBdD0LOIPXqOZ0U6kZvQlJo1BoHqhzGTL7iTqkJ9X"
    no_witness = cli("log", "verify", str(path), "--key", vkey, "--witness-key", witness)
    assert no_witness.returncode in (1, 3)
    foreign = "test.example/log+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
    bad_key = cli("log", "verify", str(path), "--key", foreign)
    assert bad_key.returncode in (1, 3)
    # a flipped bit in the inclusion proof
    lines = proof.stdout.split("\n")
    h = bytearray(base64.b64decode(lines[3]))
    h[0] ^= 1
    lines[3] = base64.b64encode(bytes(h)).decode()
    path.write_text("\n".join(lines))
    flipped = cli("log", "verify", str(path), "--key", vkey, "--json")
    assert flipped.returncode == 1 and json_of(flipped)["ok"] is False

    # the seal rewritten in the database (its guard dropped first): the old proof no longer
    # matches the job
    drop_guards(store_url)
    RawDb(store_url).execute("UPDATE seals SET event_count = 1 WHERE job_id = ?", (jobs[1],))
    path.write_text(proof.stdout)
    tampered = cli("log", "verify", str(path), "--key", vkey, "--job", jobs[1], "--db", store_url)
    assert tampered.returncode == 1


def test_consistency_json(store_url: str, tmp_path: Path) -> None:
    _jobs(store_url, 2)
    assert cli("log", "integrate", "--db", store_url).returncode == 0
    small = cli("log", "checkpoint", "--db", store_url).stdout
    _jobs(store_url, 3)
    assert cli("log", "integrate", "--db", store_url).returncode == 0
    big = cli("log", "checkpoint", "--db", store_url).stdout
    out = cli("log", "consistency", "2", "5", "--db", store_url, "--json")
    assert out.returncode == 0, out.stderr
    doc = json_of(out)
    assert set(doc) == {"old_size", "new_size", "proof"} and doc["old_size"] == 2
    old = Checkpoint.from_text(parse_note(small).text)
    new = Checkpoint.from_text(parse_note(big).text)
    proof = [base64.b64decode(h) for h in doc["proof"]]
    verify_consistency(2, 5, proof, old.root, new.root)
    bad = cli("log", "consistency", "4", "9", "--db", store_url, "--json")
    assert bad.returncode == 3 and "tree's size" in json_of(bad)["error"]["message"]


def test_crash_mid_integration_loses_nothing(store_url: str) -> None:
    jobs = _jobs(store_url, 4)
    crashed = cli(
        "log", "integrate", "--db", store_url, env={"AFFIDAVIT_CRASH_AT": "log.before_integrate"}
    )
    assert crashed.returncode == -9
    # the lease of the dead sequencer expires; until then another one is refused politely
    busy = cli("log", "integrate", "--db", store_url, "--json")
    assert busy.returncode == 0 and json_of(busy)["busy"] is True
    RawDb(store_url).execute("UPDATE tlog_state SET lease_until = 0", ())
    done = cli("log", "integrate", "--db", store_url, "--json")
    assert json_of(done)["integrated"] == 4
    for job in jobs:
        assert cli("log", "proof", job, "--db", store_url).returncode == 0


CHARGE_TOOLS = """
import affidavit

@affidavit.tool("charge")
def charge(ctx, amount=1):
    return {"charged": amount}
"""


def test_worker_integrates_its_seals(store_url: str, tmp_path: Path) -> None:
    plan = tmp_path / "two_charges.json"
    plan.write_text(json.dumps(TWO_CHARGES))
    tools_py = tmp_path / "charge_tools.py"
    tools_py.write_text(CHARGE_TOOLS)
    sub = cli(
        "submit",
        str(plan),
        "--tools",
        str(tools_py),
        "--input",
        '{"amount": 3}',
        "--db",
        store_url,
        "--json",
    )
    assert sub.returncode == 0, sub.stderr
    job = json_of(sub)["job_id"]
    ran = cli("worker", "--until-idle", "--tools", str(tools_py), "--db", store_url)
    assert ran.returncode == 0, ran.stderr
    assert cli("log", "proof", job, "--db", store_url).returncode == 0
