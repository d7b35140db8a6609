"""`affidavit log monitor` as an auditor runs it against a served log over loopback HTTP, on
both backends: a checkpoint record per tree verified, and the operator's second leaf for a job
and a rewritten history reported as JSON lines, with evidence, exit 1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.cli.test_cli import cli, cli_env
from tests.tlog import operator
from tests.tlog.test_witness_audit import ORIGIN, log_vkey, logged


def monitor(state: Path, url: str, vkey: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("log", "monitor", "--log-url", url, "--log-key", vkey, "--state", str(state),
               *extra)  # fmt: skip


def lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_monitor_verifies_and_reports_a_second_leaf(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = served
    state = tmp_path / "monitor"
    jobs = logged(store_url, 3)
    vkey = log_vkey(store_url)
    first = monitor(state, url, vkey)
    assert first.returncode == 0, first.stderr
    (record,) = lines(first)
    assert record["kind"] == "checkpoint" and record["origin"] == ORIGIN
    assert (record["size"], record["previous_size"], record["new_entries"]) == (3, None, 3)

    logged(store_url, 2)
    (record,) = lines(monitor(state, url, vkey, "--once"))
    assert (record["size"], record["previous_size"], record["new_entries"]) == (5, 3, 2)

    leaf = operator.leaf_at(store_url, 2)
    operator.append(store_url, [(jobs[2], operator.resealed(leaf))])
    for _ in range(2):  # reported at every run until someone deals with it
        found = monitor(state, url, vkey)
        assert found.returncode == 1, found.stdout + found.stderr
        (record,) = lines(found)
        assert record["kind"] == "duplicate_job" and record["job_id"] == jobs[2]
        assert (record["index"], record["earlier_index"], record["size"]) == (5, 2, 6)
        evidence = json.loads(Path(record["evidence"]).read_text())
        assert evidence["findings"][0]["job_id"] == jobs[2]
        assert evidence["checkpoint"].startswith(f"{ORIGIN}\n6\n")
    assert json.loads((state / "monitor.json").read_text())["size"] == 5


def test_monitor_reports_a_fork_and_a_malformed_leaf(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = served
    vkey = log_vkey(store_url)
    jobs = logged(store_url, 3)
    state = tmp_path / "monitor"
    assert monitor(state, url, vkey).returncode == 0

    operator.rebuild(store_url, list(reversed(jobs)), ORIGIN)  # same size, another history
    forked = monitor(state, url, vkey, "--json")
    assert forked.returncode == 1, forked.stdout + forked.stderr
    (record,) = lines(forked)
    assert record["kind"] == "fork" and record["reason"] == "two roots for size 3"
    assert record["verified_size"] == 3
    (path,) = state.glob("fork-3-*.json")
    assert f"{ORIGIN}\n3\n" in json.loads(path.read_text())["offending_checkpoint"]

    fresh = tmp_path / "fresh"  # a monitor that starts on the rebuilt log: no fork to see
    operator.append(store_url, [("job-x", b"[1, 2]")])
    found = monitor(fresh, url, vkey)
    assert found.returncode == 1, found.stdout + found.stderr
    (record,) = lines(found)
    assert record["kind"] == "malformed_leaf" and record["index"] == 3
    assert "not a JSON object" in record["reason"]


def test_monitor_follows_until_sigterm(
    store_url: str, served: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = served
    vkey = log_vkey(store_url)
    logged(store_url, 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "log", "monitor", "--log-url", url, "--log-key",
         vkey, "--state", str(tmp_path / "m"), "--follow", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert (first["kind"], first["size"]) == ("checkpoint", 2)
        logged(store_url, 1)
        second = json.loads(proc.stdout.readline())
        assert (second["kind"], second["size"], second["new_entries"]) == ("checkpoint", 3, 1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
