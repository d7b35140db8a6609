"""``affidavit worker --processes N`` as real processes on both backends: the children share
the jobs, a killed child is started again and its job recovered, signals stop them all, a
child's store error stops them all (exit 3), bad options start nothing, counters are summed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from affidavit.runtime import submit_job
from affidavit.store import JobFilter, open_store
from tests.cli.test_cli import cli_env

TOOLS = """
import os
import time
from affidavit import tool


@tool("wp_effect")
def effect(ctx, log: str, n: int, sleep: float) -> dict:
    time.sleep(sleep)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {n}\\n")
    return {"pid": os.getpid(), "n": n}
"""
PLAN = {
    "name": "wp",
    "nodes": [
        {
            "id": "e",
            "type": "tool",
            "tool": "wp_effect",
            "args": {"log": "${input.log}", "n": "${input.n}", "sleep": "${input.sleep}"},
        }
    ],
}
DEADLINE = 120.0


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "wp_tools.py"
    path.write_text(TOOLS)
    return path


def _submit(url: str, log: Path, count: int, sleep: float) -> list[str]:
    store = open_store(url)
    try:
        return [
            submit_job(store, PLAN, {"log": str(log), "n": n, "sleep": sleep}, tools=None)[0].job_id
            for n in range(count)
        ]
    finally:
        store.close()


def _effects(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    return [(int(p), int(n)) for p, n in (line.split() for line in log.read_text().splitlines())]


def _statuses(url: str, jobs: list[str]) -> dict[str, str]:
    store = open_store(url)
    try:
        return {j.job_id: j.status for j in store.list_jobs(JobFilter(limit=1000))}
    finally:
        store.close()


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _until(what: str, check: object, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _supervisor(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", *args],
        env=cli_env(),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_processes_share_the_jobs(store_url: str, tools_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    jobs = _submit(store_url, log, 12, 0.3)
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "worker", "--processes", "2", "--tools",
         str(tools_file), "--until-idle", "--db", store_url, "--json"],
        env=cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"jobs_run": 12, "processes": 2, "restarts": 0}
    assert set(_statuses(store_url, jobs).values()) == {"completed"}
    effects = _effects(log)
    assert sorted(n for _, n in effects) == list(range(12))  # each effect once
    pids = {pid for pid, _ in effects}
    assert len(pids) == 2 and os.getpid() not in pids


def test_a_killed_process_is_started_again_and_signals_stop_all(
    store_url: str, tools_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    jobs = _submit(store_url, log, 8, 0.4)
    sup = _supervisor("--processes", "2", "--tools", str(tools_file), "--lease-seconds", "1",
                      "--db", store_url, "--json", cwd=tmp_path)  # fmt: skip
    try:
        _until("two worker processes", lambda: len(_children(sup.pid)) == 2)
        first = _children(sup.pid)
        _until("a first effect", lambda: _effects(log))
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        _until(
            "a process started in its place",
            lambda: len(_children(sup.pid)) == 2 and victim not in _children(sup.pid),
        )
        settled = {"completed", "parked"}  # (a call killed mid-way and not reconciled parks)
        _until("every job settled", lambda: set(_statuses(store_url, jobs).values()) <= settled)
        children = _children(sup.pid)
        sup.send_signal(signal.SIGTERM)
        out, err = sup.communicate(timeout=DEADLINE)
    finally:
        if sup.poll() is None:
            sup.kill()
    assert sup.returncode == 0, err
    assert json.loads(out)["restarts"] == 1
    for pid in children:
        _until(f"process {pid} gone", lambda pid=pid: not _alive(pid), 10)
    ns = [n for _, n in _effects(log)]
    assert len(ns) == len(set(ns))  # no effect twice
    assert "completed" in _statuses(store_url, jobs).values()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_no_worker_outlives_its_supervisor(store_url: str, tmp_path: Path) -> None:
    """A supervisor killed outright (SIGKILL: it forwards nothing) leaves no worker behind:
    each child notices it is orphaned and stops gracefully."""
    sup = _supervisor("--processes", "2", "--db", store_url, cwd=tmp_path)
    try:
        _until("two worker processes", lambda: len(_children(sup.pid)) == 2)
        children = _children(sup.pid)
    finally:
        sup.kill()
        sup.communicate(timeout=DEADLINE)
    for pid in children:
        _until(f"process {pid} gone", lambda pid=pid: not _alive(pid), 30)


def test_counters_are_summed_across_processes(
    store_url: str, tools_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    jobs = _submit(store_url, log, 6, 0.2)
    port = _free_port()
    sup = _supervisor("--processes", "2", "--tools", str(tools_file), "--metrics-port",
                      str(port), "--db", store_url, cwd=tmp_path)  # fmt: skip
    try:
        _until("every job completed", lambda: set(_statuses(store_url, jobs).values()) == {
            "completed"})  # fmt: skip
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        sup.send_signal(signal.SIGTERM)
        out, err = sup.communicate(timeout=DEADLINE)
    finally:
        if sup.poll() is None:
            sup.kill()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }
    tool_steps = sum(
        v for (name, labels), v in samples.items()
        if name == "affidavit_steps_total" and ("node_type", "tool") in labels
    )  # fmt: skip
    assert tool_steps == 6
    assert samples[("affidavit_worker_restarts_total", ())] == 0
    assert sup.returncode == 0, err
    assert out.strip() == "jobs run: 6"
    assert "worker supervisor: 2 processes" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--tools", "no_such_tools.py"], 3, "not found"),
        (["--processes", "0"], 3, "--processes"),
        (["--processes", "65"], 3, "--processes"),
    ],
)
def test_bad_options_start_no_process(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    db = f"sqlite:///{tmp_path / 'never.sqlite'}"
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "worker", "--processes", "2", *args, "--db", db],
        env=cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "worker supervisor" not in proc.stderr
    assert not (tmp_path / "never.sqlite").exists()


def test_a_store_error_stops_every_process(tmp_path: Path) -> None:
    """A database that stays unavailable past --max-outage-seconds ends each child with exit 3;
    the supervisor stops the others and exits 3 (a restart would only fail again)."""
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "worker", "--processes", "2", "--until-idle",
         "--max-outage-seconds", "0.5", "--db", "postgresql://root@127.0.0.1:1/nowhere"],
        env=cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "stopping every worker process" in proc.stderr
    assert "Traceback" not in proc.stderr
