"""An export verified offline: ``affidavit jobs events --json`` → ``verify_events`` gives what
``verify_job`` gives on the database, for jobs of every status, on both backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry, verify_events, verify_job
from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.verify import VerificationResult
from tests.cli.test_cli import cli, json_of
from tests.runtime.helpers import ledger_rows
from tests.verify.helpers import RawDb, charge_tool, crash_in_flight, park_in_flight, plan

# what JSON texts differ on: non-ASCII and astral text, keys that sort differently by UTF-16
# code units, doubles written in exponent form or without a fraction, nesting
ODD = {
    "text": 'naïve ☃ 𝄞 \u2028 \x01 "quoted" \\',
    "keys": {"𝄞": 1, "\uffff": 2, "é": 3, "": 4},
    "doubles": [0.1, 1e-7, 1.5e-6, 1e21, 5.0, -0.0, 1e300, 5e-324, 123456789012345.6],
    "integers": [2**53 - 1, -(2**53 - 1), 0],
    "nested": {"a": [{"b": {"c": [[], {}]}}], "n": None, "t": True},
}


def odd_tool(result: dict[str, Any]) -> Tool:
    def fn(ctx: ToolContext, amount: int = 1, limits: Any = None) -> dict[str, Any]:
        return {"charged": amount, **result}

    return Tool("charge", fn, "tool")


def exported(url: str, job_id: str) -> list[dict[str, Any]]:
    """The job's events as `affidavit jobs events --json` prints them, read back as JSON."""
    result = cli("jobs", "events", job_id, "--db", url, "--json")
    assert result.returncode == 0, result.stderr
    events: list[dict[str, Any]] = json_of(result)
    return events


def offline(rt: Runtime, url: str, job_id: str) -> VerificationResult:
    """``verify_events`` over the CLI export, with the job's seal and status as `jobs show
    --json` prints them, the recorded keys and the ledger."""
    shown = cli("jobs", "show", job_id, "--db", url, "--json")
    assert shown.returncode == 0, shown.stderr
    job = json_of(shown)
    stored = rt.store.get_seal(job_id)
    assert job["seal"] == (stored.to_dict() if stored is not None else None)
    return verify_events(
        exported(url, job_id),
        job_id=job_id,
        seal=job["seal"],
        public_keys=[k.public_key_b64 for k in rt.store.signing_keys()],
        ledger=ledger_rows(rt.store, job_id),
        status=job["status"],
    )


def assert_same_verdict(rt: Runtime, url: str, job_id: str) -> VerificationResult:
    online = verify_job(rt.store, job_id)
    assert online.ok, online.checks()
    assert offline(rt, url, job_id).to_dict() == online.to_dict()
    seal = rt.store.get_seal(job_id)
    keys = rt.store.signing_keys()
    stored = verify_events(rt.store.list_events(job_id), seal=seal, public_keys=keys)
    assert stored.to_dict() == online.to_dict()
    as_bytes = [
        {**e.to_dict(), "job_id": job_id, "payload": e.payload_bytes}
        for e in rt.store.list_events(job_id)
    ]
    assert verify_events(as_bytes, seal=seal, public_keys=keys).to_dict() == online.to_dict()
    return online


TWO = plan(
    {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": "${input.amount}"}},
    {"id": "b", "type": "tool", "tool": "charge", "args": {"amount": 2}, "depends_on": ["a"]},
)


def _completed(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    job_id = rt.submit(TWO, {"amount": 4, "odd": ODD}).job_id
    rt.run_until_idle()
    return job_id


def _failed(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    failing = plan(
        {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": 1}},
        {"id": "b", "type": "tool", "tool": "declined", "depends_on": ["a"]},
    )
    job_id = rt.submit(failing, {"odd": ODD}).job_id
    rt.run_until_idle()
    return job_id


def _cancelled(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    job_id = rt.submit(TWO, {"amount": 1}).job_id
    rt.cancel(job_id, reason="not needed ☃", by="test")
    return job_id


def _waiting(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    approval = plan(
        {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": 1}},
        {"id": "ok", "type": "approval", "depends_on": ["a"]},
    )
    job_id = rt.submit(approval, {"odd": ODD}).job_id
    rt.run_until_idle()
    return job_id


def _running(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    return crash_in_flight(rt, mp, TWO)


def _parked(rt: Runtime, mp: pytest.MonkeyPatch) -> str:
    return park_in_flight(rt, mp, TWO)


JOBS: dict[str, Callable[[Runtime, pytest.MonkeyPatch], str]] = {
    "completed": _completed,
    "failed": _failed,
    "cancelled": _cancelled,
    "waiting": _waiting,
    "running": _running,
    "parked": _parked,
}


@pytest.mark.parametrize("status", list(JOBS))
def test_export_verifies_offline_as_verify_job_in_every_status(
    status: str,
    store_url: str,
    make_runtime: Callable[..., Runtime],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = make_runtime(ToolRegistry([odd_tool({"odd": ODD}), charge_tool("declined", fail=True)]))
    job_id = JOBS[status](rt, monkeypatch)
    assert rt.get_job(job_id).status == status
    online = assert_same_verdict(rt, store_url, job_id)
    assert online.seal.present is (status in ("completed", "failed", "cancelled"))
    if status in ("running", "parked"):
        assert len(online.tool_invocation_ledger_proof.pending_idempotency_keys) == 1


def _one_step(rt: Runtime) -> str:
    job_id = rt.submit(plan({"id": "a", "type": "tool", "tool": "charge", "args": {}})).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    return job_id


def test_ledger_result_with_an_integral_double_beyond_2_53_compares_offline(
    store_url: str, make_runtime: Callable[..., Runtime]
) -> None:
    """JCS writes 1.7e18 as ``1700000000000000000``; the ledger row's result is read back as
    that double, as the log's payloads are, so its hash is the commit's."""
    rt = make_runtime(ToolRegistry([odd_tool({"elapsed_ns": 1.7e18})]))
    job_id = _one_step(rt)
    [row] = ledger_rows(rt.store, job_id)
    assert row.result == {"charged": 1, "elapsed_ns": 1.7e18}
    assert type(row.result["elapsed_ns"]) is float
    assert_same_verdict(rt, store_url, job_id)


def test_commit_of_a_result_with_an_integral_double_beyond_2_53_verifies(
    store_url: str, make_runtime: Callable[..., Runtime]
) -> None:
    """A result whose canonical bytes are not orjson's (``0.000001``, written ``1e-6`` by
    orjson) holding a double from 2^53 on (parsed as an int): its result hash recomputes."""
    rt = make_runtime(ToolRegistry([odd_tool({"elapsed_ns": 1.7e18, "tolerance": 1e-6})]))
    job_id = _one_step(rt)
    assert_same_verdict(rt, store_url, job_id)
    # and as decoded objects read from the stored JCS text by a parser that reads the digits
    # of 1.7e18 as an integer
    seal = rt.store.get_seal(job_id)
    events = [
        {"job_id": job_id, **orjson.loads(canonical(e.to_dict()))}
        for e in rt.store.list_events(job_id)
    ]
    result = verify_events(events, seal=seal, public_keys=rt.store.signing_keys())
    assert result.ok, result.checks()


def test_plan_with_an_integral_double_beyond_2_53_verifies(
    store_url: str, make_runtime: Callable[..., Runtime]
) -> None:
    """The same for the task graph: its plan_hash recomputes."""
    rt = make_runtime(ToolRegistry([odd_tool({})]))
    limits = {"max_ns": 1.7e18, "tolerance": 1e-6}
    job_plan = plan({"id": "a", "type": "tool", "tool": "charge", "args": {"limits": limits}})
    job_id = rt.submit(job_plan).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert_same_verdict(rt, store_url, job_id)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("invocation_id", "01a20000-0000-7000-8000-000000000000"),
        ("node_id", "b"),
        ("step_id", "0000000000000000"),
        ("tool_name", "refund"),
        ("args_hash", "0000000000000000"),
        ("result", '{"charged":400}'),
    ],
)
def test_ledger_rows_given_offline_are_compared_as_verify_job_compares_them(
    column: str, value: str, store_url: str, make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    """Every column of a committed row that verify_job compares with the log, verify_events
    compares too when it is given the rows: an edited one fails both alike."""
    rt = make_runtime(ToolRegistry([odd_tool({})]))
    job_id = rt.submit(TWO, {"amount": 4}).job_id
    rt.run_until_idle()
    raw.execute(
        f"UPDATE tool_invocations SET {column} = ? WHERE job_id = ? AND node_id = 'a'",
        (value, job_id),
    )
    online = verify_job(rt.store, job_id)
    assert not online.tool_invocation_ledger_proof.ok
    assert offline(rt, store_url, job_id).to_dict() == online.to_dict()
    assert (
        offline(rt, store_url, job_id).tool_invocation_ledger_proof.errors
        == online.tool_invocation_ledger_proof.errors
    )
    if column in ("invocation_id", "result"):  # the columns a proof pack's ledger carries
        digests = [
            (r.idempotency_key, r.status, r.invocation_id, canonical_sha256(r.result))
            for r in ledger_rows(rt.store, job_id)
        ]
        packed = verify_events(exported(store_url, job_id), job_id=job_id, ledger_digests=digests)
        assert (
            packed.tool_invocation_ledger_proof.errors == online.tool_invocation_ledger_proof.errors
        )
