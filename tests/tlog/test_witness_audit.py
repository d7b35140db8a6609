"""A witness audits the entries a checkpoint adds, not only its consistency: the operator who
appends a second leaf for a rewritten job (bypassing the store, with the real log key) keeps
the tree consistent, and is refused all the same. Served logs over loopback HTTP, the witness
as a subprocess, both backends."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from affidavit.record._sealing import Sealer
from affidavit.store import open_store
from affidavit.tlog import JobIndex, LogKey, Sequencer, default_log_key_path
from tests.cli.test_cli import cli, cli_env, json_of
from tests.tlog import operator
from tests.tlog.helpers import seal_jobs
from tests.tlog.loopback import Proxy, serve
from tests.verify.helpers import RawDb

ORIGIN = "test.example/log"
WITNESS = "witness.example/w1"


def logged(url: str, n: int) -> list[str]:
    """``n`` more sealed jobs, integrated into the log."""
    store = open_store(url)
    try:
        ids = seal_jobs(store, Sealer.for_store(store), n)
        Sequencer(store, LogKey(default_log_key_path(url)), origin=ORIGIN).integrate()
    finally:
        store.close()
    return ids


def log_vkey(url: str) -> str:
    return LogKey(default_log_key_path(url)).verifier(ORIGIN).vkey()


def witness_args(state: Path, url: str, vkey: str) -> list[str]:
    return ["witness", "run", "--once", "--state", str(state), "--name", WITNESS,
            "--log-url", url, "--log-key", vkey, "--json"]  # fmt: skip


def witness(state: Path, url: str, vkey: str, api_key: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AFFIDAVIT_WITNESS_API_KEY": api_key}
    return cli(*witness_args(state, url, vkey), env=env)


def cosigned_size(state: Path) -> int:
    return int(json.loads((state / "state.json").read_text())["size"])


def indexed(state: Path) -> tuple[int, int]:
    """``(size covered, job ids)`` of the witness's index."""
    index = JobIndex(state / "jobs.sqlite", ORIGIN)
    try:
        return index.size, index.count()
    finally:
        index.close()


def test_witness_refuses_a_second_leaf_for_a_job(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, api_key = served
    state = tmp_path / "witness"
    jobs = logged(store_url, 3)
    vkey = log_vkey(store_url)
    first = witness(state, url, vkey, api_key)
    assert first.returncode == 0, first.stderr
    assert json_of(first)["cosigned"] is True and indexed(state) == (3, 3)

    # a new job, then the operator's second leaf for job 1 (rewritten, re-sealed), by SQL
    logged(store_url, 1)
    old_leaf = operator.leaf_at(store_url, 1)
    second = operator.resealed(old_leaf)
    assert operator.append(store_url, [(jobs[1], second)]) == 5

    for _ in range(2):  # refused, and refused again: the witness does not move past it
        refused = witness(state, url, vkey, api_key)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        error = json_of(refused)["error"]
        assert error["code"] == "duplicate_job"
        assert f"leaf 4 repeats job {jobs[1]!r} (first logged at leaf 1)" in error["message"]
    assert cosigned_size(state) == 3 and indexed(state) == (3, 3)
    assert f"— {WITNESS} " not in httpx.get(f"{url}/log/checkpoint").text

    evidence = [json.loads(p.read_text()) for p in sorted(state.glob("duplicate_job-5-*.json"))]
    assert len(evidence) == 2
    doc = evidence[0]
    assert doc["reason"] == "duplicate_job" and doc["size"] == 5
    assert doc["checkpoint"].startswith(f"{ORIGIN}\n5\n") and f"— {ORIGIN} " in doc["checkpoint"]
    (finding,) = doc["findings"]
    assert finding["job_id"] == jobs[1]
    assert (finding["index"], finding["earlier_index"]) == (4, 1)
    assert base64.b64decode(finding["leaf"]) == second
    assert base64.b64decode(finding["earlier_leaf"]) == old_leaf


def test_a_job_twice_in_one_batch_and_a_first_checkpoint_are_audited(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    """A witness with no state trusts the first checkpoint's consistency, never its entries;
    a repeat inside one batch is a repeat."""
    url, api_key = served
    jobs = logged(store_url, 2)
    leaf = operator.leaf_at(store_url, 0)
    operator.append(store_url, [(jobs[0], operator.resealed(leaf))])
    state = tmp_path / "witness"
    refused = witness(state, url, log_vkey(store_url), api_key)
    assert refused.returncode == 1 and json_of(refused)["error"]["code"] == "duplicate_job"
    assert not (state / "state.json").exists() and indexed(state) == (0, 0)
    (path,) = state.glob("duplicate_job-3-*.json")
    (finding,) = json.loads(path.read_text())["findings"]
    assert (finding["index"], finding["earlier_index"], finding["job_id"]) == (2, 0, jobs[0])
    assert base64.b64decode(finding["earlier_leaf"]) == leaf


def test_witness_refuses_a_malformed_leaf(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, api_key = served
    state = tmp_path / "witness"
    logged(store_url, 2)
    vkey = log_vkey(store_url)
    assert witness(state, url, vkey, api_key).returncode == 0
    bad = b'{"type":"affidavit.seal/v1","job_id":"job-x"}'
    operator.append(store_url, [("job-x", bad)])
    refused = witness(state, url, vkey, api_key)
    assert refused.returncode == 1, refused.stderr
    error = json_of(refused)["error"]
    assert error["code"] == "malformed_leaf" and "leaf 2 is malformed" in error["message"]
    (path,) = state.glob("malformed_leaf-3-*.json")
    (finding,) = json.loads(path.read_text())["findings"]
    assert finding["index"] == 2 and base64.b64decode(finding["leaf"]) == bad
    assert cosigned_size(state) == 2


def test_entries_that_do_not_match_the_root_are_refused(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    """The log serves, for leaf 3, a copy of leaf 1 (its rows edited, its signed tree not):
    were the entries trusted, that would be a duplicate; they do not hash to the root, so
    nothing in them is believed."""
    url, api_key = served
    state = tmp_path / "witness"
    logged(store_url, 2)
    vkey = log_vkey(store_url)
    assert witness(state, url, vkey, api_key).returncode == 0
    logged(store_url, 2)
    copy = operator.leaf_at(store_url, 1)
    RawDb(store_url).execute("UPDATE tlog_leaves SET leaf = ? WHERE idx = 3", (copy,))
    refused = witness(state, url, vkey, api_key)
    assert refused.returncode == 1, refused.stderr
    error = json_of(refused)["error"]
    assert error["code"] == "entries_mismatch"
    assert "do not hash to its signed root at size 4" in error["message"]
    assert cosigned_size(state) == 2 and indexed(state) == (2, 2)
    assert not list(state.glob("duplicate_job-*"))


def test_an_upgraded_witness_audits_from_leaf_0(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    """A state cosigned before the index existed (here: the index removed): the next step
    audits every leaf, including the ones cosigned before — and finds the repeat among them."""
    url, api_key = served
    state = tmp_path / "witness"
    jobs = logged(store_url, 2)
    vkey = log_vkey(store_url)
    operator.append(store_url, [(jobs[0], operator.resealed(operator.leaf_at(store_url, 0)))])
    (state / "jobs.sqlite").parent.mkdir(parents=True)
    # the witness before this audit existed cosigned size 3; simulate it with the state it wrote
    checkpoint = httpx.get(f"{url}/log/checkpoint").text
    root = checkpoint.split("\n")[2]
    (state / "state.json").write_text(
        json.dumps({"origin": ORIGIN, "size": 3, "root": root, "checkpoint": checkpoint})
    )
    logged(store_url, 1)
    refused = witness(state, url, vkey, api_key)
    assert refused.returncode == 1 and json_of(refused)["error"]["code"] == "duplicate_job"
    assert cosigned_size(state) == 3 and indexed(state) == (0, 0)


def test_the_index_survives_a_restart_and_a_crash(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, api_key = served
    state = tmp_path / "witness"
    vkey = log_vkey(store_url)
    env = cli_env({**os.environ, "AFFIDAVIT_WITNESS_API_KEY": api_key})
    jobs = logged(store_url, 260)  # two entry bundles

    # (1) killed in the middle of its audit: the first bundle read, the second held
    proxy = Proxy(url, hold=r"/log/tile/entries/001\.p/4")
    with serve(proxy) as front:
        proc = subprocess.Popen([sys.executable, "-m", "affidavit",
                                 *witness_args(state, front.url, vkey)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert proxy.held.wait(120), proc.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        proxy.release.set()
    assert not (state / "state.json").exists() and indexed(state) == (0, 0)
    again = witness(state, url, vkey, api_key)
    assert again.returncode == 0, again.stdout + again.stderr
    assert indexed(state) == (260, 260)

    # (2) killed after its state and index were written, before the log heard of it
    logged(store_url, 2)
    proxy = Proxy(url, hold=r"/log/cosignatures")
    with serve(proxy) as front:
        proc = subprocess.Popen([sys.executable, "-m", "affidavit",
                                 *witness_args(state, front.url, vkey)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert proxy.held.wait(120), proc.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        proxy.release.set()
    assert cosigned_size(state) == 262 and indexed(state) == (262, 262)
    assert f"— {WITNESS} " not in httpx.get(f"{url}/log/checkpoint").text
    restarted = witness(state, url, vkey, api_key)  # hands the same cosignature back
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert json_of(restarted)["reason"] == "already cosigned; handed back"
    assert f"— {WITNESS} " in httpx.get(f"{url}/log/checkpoint").text
    again = witness(state, url, vkey, api_key)
    assert json_of(again)["reason"] == "already cosigned"

    # (3) a crash between the state and the index: the index lags one step and catches up
    before = tmp_path / "jobs-before.sqlite"
    shutil.copy(state / "jobs.sqlite", before)
    logged(store_url, 1)
    assert witness(state, url, vkey, api_key).returncode == 0
    shutil.copy(before, state / "jobs.sqlite")
    assert cosigned_size(state) == 263 and indexed(state) == (262, 262)
    logged(store_url, 1)
    caught_up = witness(state, url, vkey, api_key)
    assert caught_up.returncode == 0, caught_up.stdout + caught_up.stderr
    assert json_of(caught_up)["size"] == 264 and indexed(state) == (264, 264)

    # and the restored index still knows every job: a repeat of the very first is refused
    operator.append(store_url, [(jobs[0], operator.resealed(operator.leaf_at(store_url, 0)))])
    refused = witness(state, url, vkey, api_key)
    assert refused.returncode == 1 and json_of(refused)["error"]["code"] == "duplicate_job"
    assert "first logged at leaf 0" in json_of(refused)["error"]["message"]
