"""`affidavit keys list | trust | rotate` and the refusal of a seal key the database does not
accept, as an operator meets them on several hosts (``cli``, tests/cli/test_cli.py), on both
backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from affidavit.core.signing import SigningKey
from affidavit.examples import refund
from tests.cli.test_cli import cli, cli_env, json_of

TOOLS = "affidavit.examples.refund"


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(refund.PLAN))
    return path


def host_key(tmp_path: Path, host: str) -> tuple[Path, SigningKey]:
    """The key file of one host (made now)."""
    path = tmp_path / host / "affidavit-signing.key"
    return path, SigningKey.load_or_create(path)


def submit(url: str, plan_file: Path, shop: Path, order_id: str) -> str:
    job_input = json.dumps({"order_id": order_id, "data_dir": str(shop)})
    r = cli("submit", str(plan_file), "--tools", TOOLS, "--input", job_input, "--db", url,
            "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return str(json_of(r)["job_id"])


def worker(url: str, key: Path) -> subprocess.CompletedProcess[str]:
    return cli("worker", "--tools", TOOLS, "--until-idle", "--db", url, "--json",
               env={"AFFIDAVIT_SIGNING_KEY": str(key)})  # fmt: skip


def test_two_hosts_each_with_its_key(store_url: str, tmp_path: Path, plan_file: Path) -> None:
    """Host A's worker registers the first key; host B's refuses to start, with the remedy;
    `keys trust` of B's public key lets it run; verify accepts both, and --trusted-key pins."""
    shop = refund.setup_shop(tmp_path / "shop")
    a_path, a = host_key(tmp_path, "a")
    b_path, b = host_key(tmp_path, "b")
    job_a = submit(store_url, plan_file, shop, "A-1001")
    assert worker(store_url, a_path).returncode == 0
    job_b = submit(store_url, plan_file, shop, "A-1002")

    refused = worker(store_url, b_path)
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr
    error = json_of(refused)["error"]
    assert error["code"] == "seal_key_refused"
    assert f"seal key {b.key_id}" in error["message"]
    assert f"affidavit keys trust {b.public.public_key_b64}" in error["hint"]
    assert "affidavit keys rotate" in error["hint"]
    assert json_of(cli("jobs", "show", job_b, "--db", store_url, "--json"))["status"] == "pending"

    listed = json_of(cli("keys", "list", "--db", store_url, "--json"))["keys"]
    assert [(k["key_id"], k["status"]) for k in listed] == [(a.key_id, "active")]
    assert listed[0]["added_at"]

    trusted = cli("keys", "trust", b.public.public_key_b64, "--db", store_url, "--json")
    assert trusted.returncode == 0, trusted.stderr
    assert json_of(trusted)["registered"] is True
    assert json_of(worker(store_url, b_path)) == {"jobs_run": 1}
    listed = json_of(cli("keys", "list", "--db", store_url, "--json"))["keys"]
    assert {k["key_id"]: k["status"] for k in listed} == {a.key_id: "active", b.key_id: "active"}

    for job_id, key in ((job_a, a), (job_b, b)):
        doc = json_of(cli("verify", job_id, "--db", store_url, "--json"))
        assert doc["ok"] is True and doc["seal"]["key_id"] == key.key_id
    pin_b = ["--trusted-key", b.public.public_key_b64]
    other = cli("verify", job_a, *pin_b, "--db", store_url, "--json")
    assert other.returncode == 1
    assert "not one of the trusted keys" in json_of(other)["seal"]["error"]
    assert cli("verify", job_b, *pin_b, "--db", store_url, "--json").returncode == 0


def test_run_and_serve_refuse_a_key_the_database_does_not_accept(
    store_url: str, tmp_path: Path, plan_file: Path
) -> None:
    shop = refund.setup_shop(tmp_path / "shop")
    a_path, _ = host_key(tmp_path, "a")
    b_path, _ = host_key(tmp_path, "b")
    submit(store_url, plan_file, shop, "A-1001")
    assert worker(store_url, a_path).returncode == 0
    env = {"AFFIDAVIT_SIGNING_KEY": str(b_path)}
    job_input = json.dumps({"order_id": "A-1002", "data_dir": str(shop)})
    run = cli("run", str(plan_file), "--tools", TOOLS, "--input", job_input, "--db", store_url,
              "--json", env=env)  # fmt: skip
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert json_of(run)["error"]["code"] == "seal_key_refused"
    jobs = json_of(cli("jobs", "list", "--db", store_url, "--json"))
    assert len(jobs) == 1  # the run submitted nothing
    served = cli("serve", "--port", "0", "--db", store_url, env=env)
    assert served.returncode == 3, served.stderr
    assert "is not registered in this database" in served.stderr
    assert "affidavit API on" not in served.stderr and "Traceback" not in served.stderr


def test_racing_workers_on_an_empty_database_register_one_key(
    empty_store_url: str, tmp_path: Path, plan_file: Path
) -> None:
    """Two hosts' workers start together on a new database: one key is registered, the
    other worker refuses (exit 3)."""
    shop = refund.setup_shop(tmp_path / "shop")
    for order_id in ("A-1001", "A-1002"):
        submit(empty_store_url, plan_file, shop, order_id)
    paths = [host_key(tmp_path, host)[0] for host in ("a", "b")]
    command = [sys.executable, "-m", "affidavit", "worker", "--tools", TOOLS, "--until-idle",
               "--db", empty_store_url, "--json"]  # fmt: skip
    procs = [
        subprocess.Popen(
            command,
            env=cli_env({"AFFIDAVIT_SIGNING_KEY": str(path)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in paths
    ]
    codes = sorted(p.wait(timeout=120) for p in procs)
    for p in procs:
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()
        p.stderr.close()
    assert codes == [0, 3]
    listed = json_of(cli("keys", "list", "--db", empty_store_url, "--json"))["keys"]
    assert len(listed) == 1
    assert listed[0]["key_id"] in {SigningKey.load(p).key_id for p in paths}


def test_rotate_retires_the_old_key_for_new_workers(
    store_url: str, tmp_path: Path, plan_file: Path
) -> None:
    shop = refund.setup_shop(tmp_path / "shop")
    path, old = host_key(tmp_path, "a")
    copy = tmp_path / "b" / "copy.key"  # another host with the same (shared) key file
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    copy.chmod(0o600)
    old_job = submit(store_url, plan_file, shop, "A-1001")
    assert worker(store_url, path).returncode == 0
    rotated = cli("keys", "rotate", "--key-file", str(path), "--db", store_url, "--json")
    assert rotated.returncode == 0, rotated.stderr
    new_id = json_of(rotated)["key_id"]
    listed = json_of(cli("keys", "list", "--db", store_url, "--json"))["keys"]
    assert {k["key_id"]: k["status"] for k in listed} == {old.key_id: "retired", new_id: "active"}

    submit(store_url, plan_file, shop, "A-1002")
    refused = worker(store_url, copy)
    assert refused.returncode == 3
    assert "is retired in this database" in json_of(refused)["error"]["message"]
    assert json_of(worker(store_url, path)) == {"jobs_run": 1}
    assert json_of(cli("verify", old_job, "--db", store_url, "--json"))["ok"] is True


def test_keys_trust_takes_a_key_file_or_a_pem_public_key(store_url: str, tmp_path: Path) -> None:
    path, key = host_key(tmp_path, "a")
    pem = tmp_path / "a.pub"
    pem.write_bytes(
        key.private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    first = json_of(cli("keys", "trust", str(pem), "--db", store_url, "--json"))
    assert (first["key_id"], first["registered"]) == (key.key_id, True)
    again = json_of(cli("keys", "trust", str(path), "--db", store_url, "--json"))
    assert (again["key_id"], again["registered"], again["status"]) == (key.key_id, False, "active")
    human = cli("keys", "list", "--db", store_url)
    assert key.key_id in human.stdout and "active" in human.stdout


@pytest.mark.parametrize("given", ["not-base64!", "AAAA", "FILE"])
def test_keys_trust_refuses_what_is_not_a_key(store_url: str, tmp_path: Path, given: str) -> None:
    assert cli("db", "migrate", "--db", store_url).returncode == 0
    if given == "FILE":
        bad = tmp_path / "junk.pem"
        bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        given = str(bad)
    r = cli("keys", "trust", given, "--db", store_url, "--json")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    error = json_of(r)["error"]
    assert error["code"] == "signing_key_error" and error["hint"]
    assert json_of(cli("keys", "list", "--db", store_url, "--json"))["keys"] == []
