"""``affidavit run | submit | worker | cancel | resume``, both backends: in the test's process
(``cli``, tests/cli/test_cli.py) where the process is not what a test is about; crashes and
signals in real processes of their own."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from affidavit.examples import refund
from tests.cli.test_cli import cli, cli_env, json_of
from tests.cli.test_refusals_cli import database_exists
from tests.conftest import PG_URL, allow_connections

TOOLS = "affidavit.examples.refund"

# The refund tools without reconcile hooks (a separate module: importing the example would
# register its tools under the same names).
PLAIN_TOOLS = """
import json
from pathlib import Path
from affidavit import pure, tool

@tool("lookup_order")
def lookup(ctx, data_dir, order_id):
    orders = json.loads((Path(data_dir) / "shop.json").read_text())["orders"]
    return {"order_id": order_id, **orders[order_id]}

@pure("decide_refund")
def decide(ctx, order):
    return {"amount": order["total"]}

@tool("issue_refund")
def pay(ctx, data_dir, order_id, amount):
    entry = {"idempotency_key": ctx.external_key, "refund_id": "rf_" + order_id,
             "order_id": order_id, "amount": amount, "status": "succeeded"}
    with (Path(data_dir) / "payments.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\\n")
    return {"refund_id": entry["refund_id"], "amount": amount, "status": "succeeded"}
"""


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return refund.setup_shop(tmp_path / "shop")


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(refund.PLAN))
    return path


def order(shop: Path, order_id: str = "A-1001") -> str:
    return json.dumps({"order_id": order_id, "data_dir": str(shop)})


def test_run_completes_and_is_idempotent(store_url: str, shop: Path, plan_file: Path) -> None:
    args = ["run", str(plan_file), "--tools", TOOLS, "--input", order(shop),
            "--idempotency-key", "k-1", "--db", store_url, "--json"]  # fmt: skip
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    doc = json_of(first)
    assert doc["status"] == "completed"
    assert doc["output"]["email"]["message_id"]
    again = json_of(cli(*args))
    assert again["job_id"] == doc["job_id"]
    assert len(refund.PaymentsLedger(shop).entries()) == 1  # ran once


def test_submit_then_worker(store_url: str, shop: Path, plan_file: Path) -> None:
    ids = []
    for order_id in ("A-1001", "A-1002", "A-1003"):
        r = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop, order_id),
                "--db", store_url, "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json_of(r)["status"] == "pending"
        ids.append(json_of(r)["job_id"])
    w = cli("worker", "--tools", TOOLS, "--until-idle", "--concurrency", "2",
            "--db", store_url, "--json")  # fmt: skip
    assert w.returncode == 0, w.stderr
    assert json_of(w) == {"jobs_run": 3}
    statuses = [json_of(cli("jobs", "show", i, "--db", store_url, "--json"))["status"] for i in ids]
    assert statuses == ["completed"] * 3
    assert sorted(e["order_id"] for e in refund.PaymentsLedger(shop).entries()) == [
        "A-1001", "A-1002", "A-1003"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("plan_patch", "input_json", "fragment"),
    [
        ({"nodes": [{"id": "x", "type": "tool", "tool": "no_such_tool"}]}, "{}", "not registered"),
        ({"nodes": [{"id": "x", "type": "robot"}]}, "{}", "unknown type"),
        (None, "{not json", "not valid JSON"),
    ],
)
def test_bad_input_submits_nothing(
    empty_store_url: str, tmp_path: Path, plan_patch: dict[str, object] | None, input_json: str,
    fragment: str,
) -> None:  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan_patch or refund.PLAN))
    r = cli(
        "run", str(path), "--tools", TOOLS, "--input", input_json, "--db", empty_store_url, "--json"
    )
    assert r.returncode == 3
    assert fragment in json_of(r)["error"]["message"]
    assert not database_exists(empty_store_url)  # refused before the database was even opened


def test_crash_park_and_resume(store_url: str, shop: Path, tmp_path: Path) -> None:
    """Without reconcile, a crash after the effect parks the job; a person resolves it."""
    plan = json.loads(json.dumps(refund.PLAN))
    plan["nodes"] = plan["nodes"][:3]  # lookup, decide, refund
    plan_path = tmp_path / "no-reconcile.json"
    plan_path.write_text(json.dumps(plan))
    tools = tmp_path / "plain_tools.py"
    tools.write_text(PLAIN_TOOLS)
    crashed = cli("run", str(plan_path), "--tools", str(tools), "--input", order(shop),
                  "--lease-seconds", "0.5", "--db", store_url, "--json",
                  env={"AFFIDAVIT_CRASH_AT": "tool.after_execute:2"})  # fmt: skip
    assert crashed.returncode == -9
    (job,) = json_of(cli("jobs", "list", "--db", store_url, "--json"))
    import time

    time.sleep(0.6)  # the dead worker's lease expires
    w = cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url, "--json")
    assert json_of(w) == {"jobs_run": 1}
    parked = json_of(cli("jobs", "show", job["job_id"], "--db", store_url, "--json"))
    assert parked["status"] == "parked"
    assert len(refund.PaymentsLedger(shop).entries()) == 1  # not re-run blindly
    bad = cli("resume", job["job_id"], "--decision", "maybe", "--db", store_url, "--json")
    assert bad.returncode == 3
    paid = refund.PaymentsLedger(shop).entries()[0]
    accepted = cli("resume", job["job_id"], "--decision", "accept_result", "--result",
                   json.dumps({"refund_id": paid["refund_id"], "amount": paid["amount"],
                               "status": "succeeded"}), "--db", store_url, "--json")  # fmt: skip
    assert accepted.returncode == 0, accepted.stdout
    assert json_of(accepted)["status"] == "pending"
    cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url, "--json")
    done = json_of(cli("jobs", "show", job["job_id"], "--db", store_url, "--json"))
    assert done["status"] == "completed"
    assert done["output"]["refund"]["refund_id"] == paid["refund_id"]
    assert len(refund.PaymentsLedger(shop).entries()) == 1


def test_worker_until_idle_names_a_dead_workers_lease_it_did_not_wait_for(
    store_url: str, shop: Path, plan_file: Path
) -> None:
    """After a crash, `worker --until-idle` exits at once leaving the job running under the dead
    worker's lease: it says so (which job, whose lease, when it expires), instead of only
    `jobs run: 0`; `--json` stays `{"jobs_run": N}`."""
    submitted = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop),
                    "--db", store_url, "--json")  # fmt: skip
    job_id = json_of(submitted)["job_id"]
    # (a long lease: nothing waits for it, and a loaded machine may take seconds per process)
    crashed = cli("worker", "--tools", TOOLS, "--until-idle", "--lease-seconds", "300",
                  "--db", store_url, env={"AFFIDAVIT_CRASH_AT": "tool.after_execute"})  # fmt: skip
    assert crashed.returncode == -9
    owner = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))["lease_owner"]
    w = cli("worker", "--tools", TOOLS, "--until-idle", "--db", store_url)
    assert w.returncode == 0, w.stderr
    assert w.stdout.strip() == "jobs run: 0"
    note = " ".join(w.stderr.split())  # (Rich wraps long lines)
    match = re.search(
        r"note: 1 job is still running under another worker's lease, not waited for "
        r"\((\S+); the first lease, (\S+)'s, expires in (\d+) s\)\. If that worker died, run the "
        r"worker again once the lease has expired: the job is recovered then\.",
        note,
    )
    assert match, w.stderr
    assert match.group(1) == job_id and match.group(2) == owner
    assert 200 <= int(match.group(3)) <= 300
    quiet = cli("worker", "--tools", TOOLS, "--until-idle", "--db", store_url, "--json")
    assert json_of(quiet) == {"jobs_run": 0}
    assert "note" not in quiet.stderr
    # a job no worker holds (pending, parked, finished) is no one's lease: no note (a plain
    # cancel would only request it: the dead worker's call is in flight)
    cli("cancel", job_id, "--force", "--db", store_url, "--json")
    after = cli("worker", "--tools", TOOLS, "--until-idle", "--db", store_url)
    assert after.returncode == 0 and "note" not in after.stderr, after.stderr


def crash_in_flight_and_park(store_url: str, job_id: str) -> None:
    """A worker process dies after the (reconcile-less) charge acted; a runtime recovers the
    job and parks it in flight."""
    from affidavit import Runtime
    from tests.runtime.crash_tools import REGISTRY
    from tests.runtime.helpers import run_driver, wait_lease_expired

    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        run_driver(store_url, "--job", job_id, "--lease", "0.5", crash="tool.after_execute")
        wait_lease_expired(rt.store, job_id)
        rt.run_job(job_id)
        assert rt.get_job(job_id).status == "parked"


def test_resume_pinned_to_a_park(store_url: str, tmp_path: Path) -> None:
    """`jobs show` names the park's version; `resume --park V` applies only to that park: a
    decision about a park resolved since (the job parked again) is refused and writes
    nothing."""
    from affidavit import Runtime
    from tests.runtime.crash_tools import REGISTRY, charge_plan

    with Runtime(store_url, tools=REGISTRY) as rt:
        plan = charge_plan("crash_charge_nr")
        job_id = rt.submit(plan, {"side": str(tmp_path / "side.jsonl"), "amount": 1}).job_id
    db = ("--db", store_url)
    crash_in_flight_and_park(store_url, job_id)
    shown = json_of(cli("jobs", "show", job_id, *db, "--json"))
    first = shown["parked"]["version"]
    assert shown["parked"]["reason"] == "in_flight" and first == shown["event_count"]
    human = cli("jobs", "show", job_id, *db)
    assert human.returncode == 0 and f'"version": {first}' in human.stdout
    assert human.stdout.splitlines()[-1] == (  # one line, however long: it is copied whole
        f"next: affidavit resume {job_id} --park {first} --decision retry|accept_result|fail"
        "   (did crash_charge_nr act? accept_result --result JSON with what it returned if it "
        "did, retry if it did not)"
    )

    resumed = cli("resume", job_id, "--decision", "retry", "--park", str(first), *db, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json_of(resumed) == {"job_id": job_id, "status": "pending", "output": None,
                                "error": None}  # fmt: skip
    crash_in_flight_and_park(store_url, job_id)  # the retry crashed in flight again
    before = json_of(cli("jobs", "show", job_id, *db, "--json"))
    second = before["parked"]["version"]
    assert second > first

    stale = cli("resume", job_id, "--decision", "retry", "--park", str(first), *db, "--json")
    assert stale.returncode == 3, stale.stderr
    error = json_of(stale)["error"]
    assert set(error) == {"code", "message", "hint"} and error["code"] == "invalid_state"
    assert f"parked at version {second} for in_flight" in error["message"]
    assert f"version {first}" in error["message"]
    said = cli("resume", job_id, "--decision", "fail", "--park", str(first), *db)
    assert said.returncode == 3 and "Traceback" not in said.stderr
    assert f"parked at version {second}" in " ".join(said.stderr.split())
    for bad in ("abc", "0"):  # (not an integer; below 1)
        usage = cli("resume", job_id, "--decision", "fail", "--park", bad, *db, "--json")
        assert usage.returncode == 3, (bad, usage.stderr)
        assert json_of(usage)["error"]["code"] == "config_error"
        assert "--park" in json_of(usage)["error"]["message"]
    assert json_of(cli("jobs", "show", job_id, *db, "--json")) == before  # nothing written

    failed = cli("resume", job_id, "--decision", "fail", "--park", str(second), *db, "--json")
    assert failed.returncode == 0, failed.stderr
    assert json_of(failed)["status"] == "failed"
    gone = cli("resume", job_id, "--decision", "fail", "--park", str(second), *db, "--json")
    assert gone.returncode == 3
    assert json_of(gone)["error"]["message"].startswith(f"job {job_id} is failed, not parked")


def test_cancel(store_url: str, shop: Path, plan_file: Path) -> None:
    r = json_of(cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop),
                    "--db", store_url, "--json"))  # fmt: skip
    c = cli("cancel", r["job_id"], "--reason", "customer withdrew", "--db", store_url, "--json")
    assert c.returncode == 0, c.stdout
    assert json_of(c)["status"] == "cancelled"
    again = cli("cancel", r["job_id"], "--db", store_url, "--json")
    assert again.returncode == 3
    assert json_of(again)["error"]["code"] == "invalid_state"
    w = json_of(cli("worker", "--tools", TOOLS, "--until-idle", "--db", store_url, "--json"))
    assert w == {"jobs_run": 0}
    assert refund.PaymentsLedger(shop).entries() == []


# --- progress on stderr -----------------------------------------------------------------------

GATED_TOOLS = """
import time
import os
import subprocess
import sys
from pathlib import Path
from affidavit import RetryableError, tool

@tool("gated")
def gated(ctx, gate):
    # waits until the test opens the gate: the run cannot end before the test saw progress
    deadline = time.monotonic() + 60
    while gate and not Path(gate).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the gate was never opened")
        time.sleep(0.02)
    return {"ok": True}

@tool("entered")
def entered(ctx, side, gate=""):
    # a side channel of real calls, then wait for the gate like "gated"
    with open(side, "a") as f:
        f.write(ctx.node_id + "\\n")
    return gated.fn(ctx, gate)

@tool("always_503", retry=2)
def always_503(ctx):
    raise RetryableError(f"upstream 503 on try {ctx.attempt}")
"""


def test_run_prints_each_step_while_the_job_runs(store_url: str, tmp_path: Path) -> None:
    """The first step's line reaches stderr while the second step still blocks: progress is
    live, not printed when the run ends; stdout carries only the job's output."""
    (tmp_path / "gated_tools.py").write_text(GATED_TOOLS)
    gate = tmp_path / "gate"
    plan = tmp_path / "gated.json"
    plan.write_text(json.dumps({"name": "gated", "nodes": [
        {"id": "first", "type": "tool", "tool": "gated", "args": {"gate": ""}},
        {"id": "second", "type": "tool", "tool": "gated", "args": {"gate": str(gate)},
         "depends_on": ["first"]},
    ]}))  # fmt: skip
    tools = str(tmp_path / "gated_tools.py")
    with running("run", str(plan), "--tools", tools, "--db", store_url) as proc:
        assert proc.stderr is not None
        seen = [proc.stderr.readline() for _ in range(2)]
        assert seen[0].startswith("job ") and seen[0].rstrip().endswith(": running"), seen
        assert seen[1].split() == ["✓", "first", "committed", *seen[1].split()[3:]], seen
        assert proc.poll() is None  # still blocked in "second"
        gate.touch()
        out, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    lines = rest.splitlines()
    assert lines[0].split()[:3] == ["✓", "second", "committed"]
    assert lines[1].endswith(": completed")
    assert json.loads(out) == {"second": {"ok": True}}


def test_run_progress_names_failures_and_json_prints_none(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "gated_tools.py").write_text(GATED_TOOLS)
    plan = tmp_path / "fails.json"
    plan.write_text(json.dumps({"name": "fails", "nodes": [
        {"id": "charge", "type": "tool", "tool": "always_503"}]}))  # fmt: skip
    args = ["run", str(plan), "--tools", str(tmp_path / "gated_tools.py"), "--db", store_url]
    r = cli(*args)
    assert r.returncode == 1
    steps = [
        re.sub(r"\(\d+ ms\)", "(N ms)", line)
        for line in r.stderr.splitlines()
        if line.startswith("  ")
    ]
    assert steps == [
        "  ↻ charge failed (retryable) (N ms): upstream 503 on try 1",
        "  ↻ charge failed (retryable) (N ms): upstream 503 on try 2",
    ]
    assert r.stderr.splitlines()[-1] == "error: upstream 503 on try 2 (RetryableError)"
    quiet = cli(*args, "--json")
    assert quiet.returncode == 1
    assert quiet.stderr == ""
    assert json_of(quiet)["status"] == "failed"


def test_worker_prints_a_line_per_job(store_url: str, shop: Path, plan_file: Path) -> None:
    ids = []
    for order_id in ("A-1001", "A-1002"):
        r = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop, order_id),
                "--db", store_url, "--json")  # fmt: skip
        ids.append(json_of(r)["job_id"])
    w = cli("worker", "--tools", TOOLS, "--until-idle", "--db", store_url)
    assert w.returncode == 0, w.stderr
    lines = [line for line in w.stderr.splitlines() if line.startswith("job ")]
    assert sorted(line.split()[1].rstrip(":") for line in lines) == sorted(ids)
    assert all(line.split()[2] == "completed" for line in lines), lines
    assert w.stdout.strip() == "jobs run: 2"


# --- stopping a worker ------------------------------------------------------------------------


@contextmanager
def running(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``affidavit ARGS`` as a subprocess, killed on the way out if it is still running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def worker_args(store_url: str, tools: Path) -> tuple[str, ...]:
    return ("worker", "--tools", str(tools), "--db", store_url)


def wait_for_lines(path: Path, count: int) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or len(path.read_text().splitlines()) < count:
        assert time.monotonic() < deadline, f"{path} never reached {count} lines"
        time.sleep(0.02)


def read_until(proc: subprocess.Popen[str], text: str) -> list[str]:
    assert proc.stderr is not None
    lines: list[str] = []
    while not lines or text not in lines[-1]:
        line = proc.stderr.readline()
        assert line, f"stderr ended before {text!r}: {lines}"
        lines.append(line)
    return lines


def two_step_plan(tmp_path: Path, side: Path, gate: Path) -> Path:
    """first (waits for ``gate``) → second; both append their node id to ``side``."""
    plan = tmp_path / "two.json"
    plan.write_text(json.dumps({"name": "two", "nodes": [
        {"id": "first", "type": "tool", "tool": "entered",
         "args": {"side": str(side), "gate": str(gate)}},
        {"id": "second", "type": "tool", "tool": "entered", "args": {"side": str(side)},
         "depends_on": ["first"]},
    ]}))  # fmt: skip
    return plan


def continue_and_verify(store_url: str, tools: Path, side: Path, job_id: str) -> None:
    """A worker started now takes the handed-back job over at once (its lease would otherwise
    hold it for 15 s, and ``--until-idle`` does not wait for a live lease) and runs only the
    step that had not run."""
    after = cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url, "--json")
    assert json_of(after) == {"jobs_run": 1}, after.stderr
    assert side.read_text().splitlines() == ["first", "second"]
    done = cli("verify", job_id, "--db", store_url, "--json")
    assert done.returncode == 0 and json_of(done)["ok"] is True


def test_worker_stops_gracefully_on_sigterm(store_url: str, tmp_path: Path) -> None:
    """SIGTERM while a tool runs: the tool finishes and commits, nothing more starts, and the
    job is handed back to the next worker."""
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side, gate = tmp_path / "calls.txt", tmp_path / "gate"
    plan = two_step_plan(tmp_path, side, gate)
    sub = cli("submit", str(plan), "--tools", str(tools), "--db", store_url, "--json")
    job_id = json_of(sub)["job_id"]

    with running(*worker_args(store_url, tools)) as proc:
        wait_for_lines(side, 1)
        proc.send_signal(signal.SIGTERM)
        read_until(proc, "SIGTERM: stopping after the steps that are running")
        assert proc.poll() is None  # the running step is not cut off
        gate.touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "jobs run: 1"
    assert f"job {job_id}: released" in err
    assert side.read_text().splitlines() == ["first"]
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["status"] == "running"
    continue_and_verify(store_url, tools, side, job_id)


def test_run_stops_after_the_running_step_on_sigterm(store_url: str, tmp_path: Path) -> None:
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side, gate = tmp_path / "calls.txt", tmp_path / "gate"
    plan = two_step_plan(tmp_path, side, gate)
    with running("run", str(plan), "--tools", str(tools), "--db", store_url) as proc:
        wait_for_lines(side, 1)
        proc.send_signal(signal.SIGTERM)
        first_lines = read_until(proc, "SIGTERM: stopping after the step that is running")
        gate.touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out == ""
    job_id = first_lines[0].split()[1].rstrip(":")
    assert f"job {job_id}: stopped by SIGTERM and handed back" in err
    assert "✓ first committed" in err
    assert side.read_text().splitlines() == ["first"]
    continue_and_verify(store_url, tools, side, job_id)


def test_a_second_signal_stops_the_worker_at_once(store_url: str, tmp_path: Path) -> None:
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side = tmp_path / "calls.txt"
    plan = tmp_path / "stuck.json"
    never = str(tmp_path / "never-opened")
    plan.write_text(json.dumps({"name": "stuck", "nodes": [
        {"id": "stuck", "type": "tool", "tool": "entered",
         "args": {"side": str(side), "gate": never}},
    ]}))  # fmt: skip
    cli("submit", str(plan), "--tools", str(tools), "--db", store_url, "--json")
    with running(*worker_args(store_url, tools)) as proc:
        wait_for_lines(side, 1)
        proc.send_signal(signal.SIGINT)
        read_until(proc, "SIGINT: stopping")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # the gate stays shut: only the signal ends it
    assert proc.returncode == 0, err
    assert "stopped at once" in err
    assert out.strip() == "jobs run: 1"  # claimed, and interrupted inside its tool


# A tool that takes its own database away while it runs, as a restart or failover would: the
# database refuses connections and its sessions are terminated, for 1.5 s (``back_after``;
# ``None``: until the test brings it back).
OUTAGE_TOOLS = """
import threading
import psycopg
from affidavit import tool

@tool("note")
def note(ctx, side, label, admin_url=None, database=None, back_after=1.5):
    with open(side, "a") as f:
        f.write(label + "\\n")
    if admin_url:
        admin = psycopg.connect(admin_url, autocommit=True)
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (database,),
        )

        def back():
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            admin.close()

        if back_after is not None:
            threading.Timer(back_after, back).start()
    return {"label": label}
"""


def submit_outage_job(
    url: str, pg_database: str, tmp_path: Path, back_after: float | None
) -> tuple[str, Path, Path]:
    """Submit a job of two ``note`` steps whose first takes ``pg_database`` away (see
    OUTAGE_TOOLS); return (job id, the tools file, the side file the steps write)."""
    tools, side = tmp_path / "outage_tools.py", tmp_path / "calls.txt"
    tools.write_text(OUTAGE_TOOLS)
    plan = tmp_path / "plan.json"
    outage = {"admin_url": PG_URL, "database": pg_database, "back_after": back_after}
    plan.write_text(json.dumps({"name": "outage", "nodes": [
        {"id": "a", "type": "tool", "tool": "note",
         "args": {"side": str(side), "label": "a", **outage}},
        {"id": "b", "type": "tool", "tool": "note", "depends_on": ["a"],
         "args": {"side": str(side), "label": "b"}},
    ]}))  # fmt: skip
    submitted = cli("submit", str(plan), "--tools", str(tools), "--db", url, "--json")
    return json_of(submitted)["job_id"], tools, side


def test_worker_rides_out_a_postgresql_outage(pg_database: str, tmp_path: Path) -> None:
    """The database goes away while a tool runs: the worker keeps trying the step's record
    and the job completes instead of parking. The outage is a one-line warning, no traceback,
    from whichever part of the worker meets it first: the run's write, or the log sequencer's
    poll (then the run's write just waits for a new connection)."""
    url = PG_URL.rsplit("/", 1)[0] + f"/{pg_database}"
    job_id, tools, side = submit_outage_job(url, pg_database, tmp_path, back_after=1.5)

    ran = cli("worker", "--tools", str(tools), "--until-idle", "--db", url)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "jobs run: 1"
    assert "the database is unavailable" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert f"job {job_id}: completed" in ran.stderr
    assert side.read_text().splitlines() == ["a", "b"]
    done = cli("verify", job_id, "--db", url, "--json")
    assert done.returncode == 0 and json_of(done)["ok"] is True


def test_worker_gives_up_on_an_outage_that_does_not_end(pg_database: str, tmp_path: Path) -> None:
    """``--max-outage-seconds``: the database goes away for good while a tool runs; the run
    gives up after ``--store-retry-seconds``, the claims that follow fail, and the worker exits
    3 with the store's error instead of waiting without end. Once the database is back, the job
    is recovered as after a crash: the step that acted is in flight (no reconcile: parked),
    never run again. (``pool_timeout=1``: while the server refuses connections, each try waits
    that long for one — 10 s by default.)"""
    url = PG_URL.rsplit("/", 1)[0] + f"/{pg_database}?pool_timeout=1"
    job_id, tools, side = submit_outage_job(url, pg_database, tmp_path, back_after=None)
    started = time.monotonic()
    ran = cli("worker", "--tools", str(tools), "--until-idle", "--db", url, "--json",
              "--max-outage-seconds", "2", "--store-retry-seconds", "1",
              "--lease-seconds", "1")  # fmt: skip
    assert ran.returncode == 3, ran.stderr
    assert time.monotonic() - started < 30  # the run's 1 s, then 2 s of failed claims, and start-up
    error = json_of(ran)["error"]
    assert error["code"] == "store_unavailable"
    assert "unavailable for 2 s or more; the worker gave up" in error["message"]
    assert error["hint"]
    assert "Traceback" not in ran.stderr
    assert side.read_text().splitlines() == ["a"]

    allow_connections(pg_database)  # the database is back
    again = cli("worker", "--tools", str(tools), "--until-idle", "--db", url, "--json")
    assert again.returncode == 0, again.stderr
    shown = json_of(cli("jobs", "show", job_id, "--db", url, "--json"))
    assert shown["status"] == "parked"  # a acted, its record did not land: in flight
    assert side.read_text().splitlines() == ["a"]  # not run again
    assert json_of(cli("verify", job_id, "--db", url, "--json"))["ok"] is True


def test_max_outage_seconds_from_the_environment_is_checked(store_url: str) -> None:
    bad = cli("worker", "--until-idle", "--db", store_url, "--json",
              env={"AFFIDAVIT_MAX_OUTAGE_SECONDS": "-1"})  # fmt: skip
    assert bad.returncode == 3
    assert json_of(bad)["error"]["message"] == "AFFIDAVIT_MAX_OUTAGE_SECONDS must be ≥ 0"
    ok = cli("worker", "--until-idle", "--db", store_url, "--json",
             env={"AFFIDAVIT_MAX_OUTAGE_SECONDS": "30"})  # fmt: skip
    assert ok.returncode == 0 and json_of(ok) == {"jobs_run": 0}
    refused = cli("worker", "--until-idle", "--max-outage-seconds", "-1", "--db", store_url)
    assert refused.returncode != 0 and "-1" in refused.stderr


def test_store_retry_seconds_from_the_environment_is_checked(store_url: str) -> None:
    bad = cli("worker", "--until-idle", "--db", store_url, "--json",
              env={"AFFIDAVIT_STORE_RETRY_SECONDS": "soon"})  # fmt: skip
    assert bad.returncode == 3
    assert (
        json_of(bad)["error"]["message"] == "AFFIDAVIT_STORE_RETRY_SECONDS='soon' is not a number"
    )
    ok = cli("worker", "--until-idle", "--store-retry-seconds", "5", "--db", store_url, "--json")
    assert ok.returncode == 0 and json_of(ok) == {"jobs_run": 0}


def test_jobs_wait_follows_a_job_a_worker_runs(store_url: str, tmp_path: Path) -> None:
    """``jobs wait`` in one process, the worker in another: the waiter prints the first step
    while the second still blocks, and returns with the job once it completes."""
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side, gate = tmp_path / "calls.txt", tmp_path / "gate"
    plan = tmp_path / "two.json"
    plan.write_text(json.dumps({"name": "two", "nodes": [
        {"id": "first", "type": "tool", "tool": "entered", "args": {"side": str(side)}},
        {"id": "second", "type": "tool", "tool": "entered",
         "args": {"side": str(side), "gate": str(gate)}, "depends_on": ["first"]},
    ]}))  # fmt: skip
    sub = cli("submit", str(plan), "--tools", str(tools), "--db", store_url, "--json")
    job_id = json_of(sub)["job_id"]
    with running("jobs", "wait", job_id, "--db", store_url) as waiter:
        lines = read_until(waiter, "pending; waiting")  # no worker yet: nothing can run
        assert lines[-1].strip() == f"job {job_id}: pending; waiting"
        with running(*worker_args(store_url, tools)):
            read_until(waiter, "first committed")  # live, while "second" waits at its gate
            assert waiter.poll() is None
            gate.touch()
            out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert "second committed" in err
    assert f"job {job_id}: completed" in err
    assert json.loads(out) == {"second": {"ok": True}}  # the output: the sinks
    assert side.read_text().splitlines() == ["first", "second"]


def test_jobs_wait_exit_codes(store_url: str, tmp_path: Path) -> None:
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    flaky = tmp_path / "flaky.json"
    flaky.write_text(json.dumps({"name": "flaky", "retry": {"backoff_seconds": 0}, "nodes": [
        {"id": "call", "type": "tool", "tool": "always_503"},
    ]}))  # fmt: skip
    job_id = json_of(cli("submit", str(flaky), "--tools", str(tools), "--db", store_url,
                         "--json"))["job_id"]  # fmt: skip

    started = time.monotonic()
    pending = cli("jobs", "wait", job_id, "--timeout", "0.5", "--db", store_url, "--json")
    assert pending.returncode == 124, pending.stderr
    assert time.monotonic() - started >= 0.5
    assert json_of(pending)["status"] == "pending"
    human = cli("jobs", "wait", job_id, "--timeout", "0.2", "--db", store_url)
    assert human.returncode == 124
    assert f"job {job_id} is still pending after 0.2 s" in human.stderr

    cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url)
    failed = cli("jobs", "wait", job_id, "--store-retry-seconds", "5", "--db", store_url, "--json")
    assert failed.returncode == 1, failed.stderr
    assert json_of(failed)["status"] == "failed"
    assert "upstream 503" in json_of(failed)["error"]["message"]

    missing = cli("jobs", "wait", "no-such-job", "--db", store_url, "--json")
    assert missing.returncode == 2
    assert json_of(missing)["error"]["code"] == "job_not_found"
    negative = cli("jobs", "wait", job_id, "--store-retry-seconds", "-1", "--db", store_url)
    assert negative.returncode not in (0, 1) and "store-retry-seconds" in negative.stderr


def test_run_of_a_job_another_worker_holds_names_its_lease(store_url: str, tmp_path: Path) -> None:
    """`run` with the idempotency key of a job a live worker is running does not run it here:
    exit 3, naming the worker and when its lease ends (a time, not a raw epoch number)."""
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side, gate = tmp_path / "calls.txt", tmp_path / "gate"
    plan = two_step_plan(tmp_path, side, gate)
    args = ("--tools", str(tools), "--idempotency-key", "held", "--db", store_url)
    job_id = json_of(cli("submit", str(plan), *args, "--json"))["job_id"]
    with running(*worker_args(store_url, tools)):
        wait_for_lines(side, 1)  # the worker is inside "first", holding the lease
        again = cli("run", str(plan), *args, "--json")
        assert again.returncode == 3, again.stderr
        message = json_of(again)["error"]["message"]
        assert f"job {job_id} is held by worker" in message
        assert re.search(r"lease until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\)", message), message
        gate.touch()


def test_a_second_signal_does_not_leave_steps_retrying_a_closed_store(
    store_url: str, tmp_path: Path
) -> None:
    """Two jobs on a worker with two claim loops, each job running two steps at once; the
    second SIGINT stops the worker at once and closes its store. The steps' threads still
    finish their tools; their records then fail for good (the store is closed, not away) and
    the process exits, instead of trying them again as if the database were down (a minute
    per step)."""
    tools = tmp_path / "gated_tools.py"
    tools.write_text(GATED_TOOLS)
    side, gate = tmp_path / "calls.txt", tmp_path / "gate"
    plan = tmp_path / "pair.json"
    plan.write_text(json.dumps({"name": "pair", "nodes": [
        {"id": node, "type": "tool", "tool": "entered",
         "args": {"side": str(side), "gate": str(gate)}}
        for node in ("left", "right")
    ]}))  # fmt: skip
    for _ in range(2):
        cli("submit", str(plan), "--tools", str(tools), "--db", store_url, "--json")
    args = (*worker_args(store_url, tools), "--concurrency", "2", "--step-concurrency", "2")
    with running(*args) as proc:
        wait_for_lines(side, 4)
        proc.send_signal(signal.SIGINT)
        read_until(proc, "SIGINT: stopping")
        proc.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        gate.touch()
        _, err = proc.communicate(timeout=150)
    assert time.monotonic() - stopped < 20, err
    assert "stopped at once" in err
    assert "trying the write again" not in err
