"""The auditor's parts alone: the job-id index (bounded, atomic, durable across a kill) and
what counts as a well-formed leaf."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.store.audit_index import job_key
from affidavit.tlog import JobIndex, leaf_job_id
from tests.cli.test_cli import cli_env

SEAL_LEAF = {
    "type": "affidavit.seal/v1",
    "job_id": "job-1",
    "event_count": 2,
    "event_chain_root_hash": "a" * 64,
    "key_id": "b" * 16,
    "seal_sha256": "c" * 64,
}


def test_the_index_costs_about_40_bytes_a_job(tmp_path: Path) -> None:
    index = JobIndex(tmp_path / "jobs.sqlite", "o.example/log")
    n = 20_000
    index.begin()
    for i in range(n):
        assert index.add(job_key(f"job-{i}"), i) is None
    index.commit(n)
    assert (index.size, index.count()) == (n, n)
    index.close()
    assert os.path.getsize(tmp_path / "jobs.sqlite") / n < 64


def test_repeats_in_the_index_and_in_the_batch(tmp_path: Path) -> None:
    index = JobIndex(tmp_path / "jobs.sqlite", "o.example/log")
    index.begin()
    assert index.add(job_key("a"), 0) is None
    assert index.add(job_key("a"), 1) == 0  # earlier in the batch
    index.commit(2)
    index.begin()
    assert index.add(job_key("b"), 2) is None
    assert index.add(job_key("a"), 3) == 0  # in the index
    index.abort()
    index.close()
    reopened = JobIndex(tmp_path / "jobs.sqlite", "o.example/log")
    assert (reopened.size, reopened.count()) == (2, 1)  # "b" was never committed
    reopened.close()
    other = JobIndex(tmp_path / "jobs.sqlite", "other.example/log")  # another log: reset
    assert (other.size, other.count()) == (0, 0)
    other.close()


_CHILD = """
import sys
from affidavit.tlog import JobIndex
from affidavit.store.audit_index import job_key
index = JobIndex(__import__("pathlib").Path(sys.argv[1]), "o.example/log")
index.begin()
for i in range(10, 5000):
    index.add(job_key(f"job-{i}"), i)
print("adding", flush=True)
while True:
    index.add(job_key("x"), 99999)
"""


def test_a_kill_in_the_middle_of_a_batch_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    index = JobIndex(path, "o.example/log")
    index.begin()
    for i in range(10):
        index.add(job_key(f"job-{i}"), i)
    index.commit(10)
    index.close()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], env=cli_env(),
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "adding\n"
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    reopened = JobIndex(path, "o.example/log")
    assert (reopened.size, reopened.count()) == (10, 10)
    reopened.begin()
    assert reopened.add(job_key("job-20"), 10) is None  # not a false repeat
    reopened.close()


def _leaf(**changes: object) -> bytes:
    doc = {**SEAL_LEAF, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def test_well_formed_leaves() -> None:
    assert leaf_job_id(_leaf()) == "job-1"
    # another affidavit leaf type names its job (or seal) id the same way
    assert leaf_job_id(b'{"type": "affidavit.trust/v1", "job_id": "trust-7"}') == "trust-7"


@pytest.mark.parametrize(
    ("leaf", "reason"),
    [
        (b"\xff", "not UTF-8 JSON"),
        (b"[" * 4000 + b"]" * 4000, "nests too deep"),
        (b"[1]", "not a JSON object"),
        (b'{"type": "affidavit.trust/v1", "job_id": "a", "job_id": "b"}', "repeats a key"),
        (_leaf(type="other/v1"), "is not affidavit.<name>/v<N>"),
        (_leaf(job_id=""), "no job_id"),
        (_leaf(job_id=7), "no job_id"),
        (_leaf(event_count=None), "not an affidavit.seal/v1 leaf"),
        (_leaf(extra="x"), "not an affidavit.seal/v1 leaf"),
        (_leaf(job_id="j" * 9000), "bytes, over 8192"),
    ],
)
def test_malformed_leaves(leaf: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("<", ".").replace(">", ".")):
        leaf_job_id(leaf)


def test_a_second_auditor_on_one_state_directory_is_refused(tmp_path: Path) -> None:
    from affidavit.tlog import AuditStateError

    first = JobIndex(tmp_path / "jobs.sqlite", "o.example/log")
    first.begin()
    second = JobIndex(tmp_path / "jobs.sqlite", "o.example/log")
    second._db.execute("PRAGMA busy_timeout = 0")
    with pytest.raises(AuditStateError, match="cannot be updated"):
        second.begin()
    first.abort()
    second.close()
    first.close()
