"""Per-claim resource bounds: a cgroup leaf holds every process of a claim, so memory and the
process count are bounded for the claim as a whole, not per process. Real sandboxed commands
on both backends; the kernel's own counters are read back into the evidence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from affidavit.claims import ClaimService, cgroups
from affidavit.store import Store
from tests.claims.conftest import make_service

SUPPORT = cgroups.support()
needs_cgroup = pytest.mark.skipif(
    not SUPPORT.kind,
    reason=f"no cgroup can be delegated to claims on this host: {SUPPORT.reason}",
)

FORKER = """import os, time
n = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print("forked", n, flush=True)
"""
# Four children of 200 MiB each (pages written, so resident): each is far below the
# per-process address-space limit, together they are over the claim's 256 MiB.
HOARDER = """import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(b"\\x01") * (200 << 20)
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
held = sum(os.waitpid(pid, 0)[1] == 0 for pid in kids)
print("held", held, flush=True)
"""


def service(store: Store, project: Path, **sandbox: object) -> ClaimService:
    svc = make_service(store, project=project, **sandbox)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    return svc


def evidence_of(svc: ClaimService, verification_id: str) -> dict[str, Any]:
    evidence = svc.get_evidence(verification_id)
    assert evidence is not None
    return evidence


@needs_cgroup
def test_a_claim_that_forks_many_children_is_stopped_at_its_pids_limit(
    store: Store, project: Path
) -> None:
    (project / "forker.py").write_text(FORKER)
    svc = service(store, project, max_processes=32)
    claim = {"output_contains": "forked 300"}
    result = svc.verify_claim("alice", "custom", claim, "python forker.py", "vera", timeout_s=60)
    evidence = evidence_of(svc, result.verification_id)
    out = str(evidence["stdout"]["excerpt"])
    assert result.verdict == "inaccurate", out
    forked = int(out.split("forked", 1)[1].split()[0])
    assert forked < 32  # bwrap, its init and the parent count too
    cgroup = evidence["limits"]["cgroup"]
    assert cgroup["version"] == SUPPORT.kind and cgroup["pids"] == 32
    assert cgroup["forks_refused"] >= 1


@needs_cgroup
def test_memory_held_across_children_is_bounded_for_the_claim(store: Store, project: Path) -> None:
    (project / "hoarder.py").write_text(HOARDER)
    svc = service(store, project, claim_memory_bytes=256 << 20)
    claim = {"output_contains": "held 4"}
    result = svc.verify_claim("alice", "custom", claim, "python hoarder.py", "vera", timeout_s=60)
    evidence = evidence_of(svc, result.verification_id)
    assert result.verdict == "inaccurate", evidence["stdout"]["excerpt"]
    cgroup = evidence["limits"]["cgroup"]
    assert cgroup["memory_bytes"] == 256 << 20 and cgroup["oom_kills"] >= 1
    assert 0 < cgroup["peak_memory_bytes"] <= 256 << 20


def test_without_a_cgroup_the_evidence_says_rlimits_only_and_they_still_bound(
    store: Store, project: Path
) -> None:
    (project / "greedy.py").write_text("buf = bytearray(1 << 30)\nprint('allocated')\n")
    svc = service(store, project, cgroup_limits=False, memory_bytes=256 << 20)
    claim = {"output_contains": "allocated"}
    result = svc.verify_claim("alice", "custom", claim, "python greedy.py", "vera")
    evidence = evidence_of(svc, result.verification_id)
    assert result.verdict == "inaccurate"
    assert "MemoryError" in evidence["stderr"]["excerpt"]  # the per-process address space
    assert evidence["limits"]["cgroup"] == {
        "version": "none",
        "reason": "cgroup limits are turned off",
    }
    assert evidence["limits"]["memory_bytes"] == 256 << 20


def test_serve_says_which_limits_bound_claims(store_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", "0", "--db", store_url],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(2)]
        port = lines[0].split("http://127.0.0.1:", 1)[1].split()[0]
        _wait_until_serving(proc, f"http://127.0.0.1:{port}/health")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if SUPPORT.kind:
        want = f"claims: bwrap jail, cgroup {SUPPORT.kind} limits (memory 1024 MiB, 256 pids)"
    else:
        want = f"claims: bwrap jail, rlimits only ({SUPPORT.reason})"
    assert lines[1].strip() == want, lines


def _wait_until_serving(proc: subprocess.Popen[str], url: str) -> None:
    """Until the server answers (its signal handlers are then installed)."""
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            assert proc.poll() is None, "the server exited"
            time.sleep(0.1)


def test_support_is_decided_by_a_real_process_in_a_leaf() -> None:
    # What the start-up line and the evidence report is what the probe found: where a leaf
    # can be made, a process really runs inside it, and removing the leaf kills what is left
    # in it (as after every claim) before the leaf goes.
    if not SUPPORT.kind:
        assert SUPPORT.reason
        return
    leaf = cgroups.Leaf.create(SUPPORT, 64 << 20, 8)
    proc = subprocess.Popen(["/bin/sleep", "300"], preexec_fn=leaf.join)
    try:
        for path in leaf.dirs:
            assert str(proc.pid) in (Path(path) / "cgroup.procs").read_text().split()
        leaf.remove()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert not any(os.path.isdir(d) for d in leaf.dirs)
    finally:
        proc.kill()
        proc.wait()


def test_the_words_for_each_kind_of_bound() -> None:
    none = cgroups.Support("", reason="cgroup v2 has no memory or pids controller here")
    assert cgroups.describe(256 << 20, 64, none) == (
        "rlimits only (cgroup v2 has no memory or pids controller here)"
    )
    v2 = cgroups.Support("v2", "/sys/fs/cgroup/x", "/sys/fs/cgroup/x")
    assert cgroups.describe(256 << 20, 64, v2) == "cgroup v2 limits (memory 256 MiB, 64 pids)"
