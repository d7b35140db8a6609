"""Export: layout, signature, refusals, and MATCH from the independent verifier (assay)."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from typer.testing import CliRunner

from affidavit import Tool, ToolContext, ToolRegistry
from affidavit.cli.main import load_commands
from affidavit.core.canonical import canonical
from affidavit.packs import PackExistsError, UnfinishedJobError, export_pack, verify_pack
from affidavit.packs import _format as F
from tests.cli.test_cli import cli
from tests.packs.helpers import JOB_KINDS, assay_verify, run_job, tools

app = load_commands()  # every command


@pytest.mark.parametrize("kind", JOB_KINDS)
def test_assay_says_match_on_exported_packs(
    make_runtime: Callable[..., Any], tmp_path: Path, kind: str
) -> None:
    rt, job_id = run_job(make_runtime, kind, tmp_path / "data")
    result = export_pack(rt.store, job_id, tmp_path / "pack")
    code, receipt, details = assay_verify(result.pack_dir, tmp_path / "out")
    assert (code, receipt.get("verdict")) == (0, "MATCH"), details
    assert receipt["original_pack_root_sha256"] == "sha256:" + result.pack_root_sha256
    assert details["errors"] == []
    assert result.assay_diverging_steps == ()


@pytest.mark.parametrize("number", [1e-7, 1e21, 5e-324], ids=["1e-7", "1e21", "5e-324"])
def test_numbers_assay_writes_otherwise_are_named_at_export(
    make_runtime: Callable[..., Any], tmp_path: Path, store_url: str, number: float
) -> None:
    """assay's canonicalizer writes exponent-form numbers otherwise than RFC 8785 (`1E-7` for
    `1e-7`), so it reports the steps whose traces hold one as diverging: export names exactly
    those steps (`pack export` says so on stderr); our verifier, exact, says MATCH."""

    def measure(ctx: ToolContext, x: float) -> Any:
        return {"ratio": x, "count": 3}

    def plain(ctx: ToolContext, m: Any) -> Any:
        return {"count": m["count"]}

    rt = make_runtime(tools(Tool("measure", measure, "pure"), Tool("plain", plain, "pure")))
    graph = {
        "name": "ratios",
        "nodes": [
            {"id": "m", "type": "pure", "tool": "measure", "args": {"x": number}},
            {
                "id": "p",
                "type": "pure",
                "tool": "plain",
                "args": {"m": "${m}"},
                "depends_on": ["m"],
            },
        ],
    }
    job_id = rt.submit(graph, {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    result = export_pack(rt.store, job_id, tmp_path / "pack")
    _, receipt, _ = assay_verify(result.pack_dir, tmp_path / "out")
    assert receipt["verdict"] == "DIVERGE"
    assert list(result.assay_diverging_steps) == receipt["divergent_step_ids"]
    assert len(result.assay_diverging_steps) == 1  # m's trace; p's and the job's output hold none
    assert verify_pack(result.pack_dir).verdict == "MATCH"
    said = cli("pack", "export", job_id, str(tmp_path / "again"), "--db", store_url, "--json")
    assert said.returncode == 0
    assert json.loads(said.stdout)["pack_root_sha256"]
    note = " ".join(said.stderr.split())
    step = result.assay_diverging_steps[0]
    assert f"note: the traces of 1 step(s) ({step}) hold numbers in exponent form" in note


def _jcs_event_lines(rt: Any, job_id: str) -> bytes:
    """events.ndjson as the contract states it: each event's envelope encoded by JCS."""
    return b"".join(
        canonical(
            {
                "job_id": job_id,
                "version": e.version,
                "event_id": e.event_id,
                "type": e.type,
                "payload": e.payload,
                "chain_hash": e.chain_hash,
            }
        )
        + b"\n"
        for e in rt.store.list_events(job_id)
    )


@pytest.mark.parametrize("kind", [*JOB_KINDS, "awkward"])
def test_event_lines_are_the_jcs_envelopes(
    make_runtime: Callable[..., Any], tmp_path: Path, kind: str
) -> None:
    """The export splices each stored payload into its envelope instead of re-encoding it; the
    lines must still be exactly JCS of the envelope, also for values JCS writes its own way."""
    if kind == "awkward":
        from tests.runtime.test_runner import AWKWARD

        def awkward(ctx: ToolContext, n: int) -> dict[str, Any]:
            return {**AWKWARD, "n": n, "\U0001f600 key": [1e21, -0.0, "\x00"]}

        rt = make_runtime(ToolRegistry([Tool("awkward", awkward, "tool")]))
        job_id = rt.submit(
            {"name": "odd \u2028 plan", "nodes": [
                {"id": "a", "type": "tool", "tool": "awkward", "args": {"n": "${input.n}"}}
            ]},
            {"n": 2.5e-7, "é": "\U0001f600"},
        ).job_id  # fmt: skip
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
    else:
        rt, job_id = run_job(make_runtime, kind, tmp_path / "data")
    result = export_pack(rt.store, job_id, tmp_path / "pack")
    assert (result.pack_dir / F.EVENTS).read_bytes() == _jcs_event_lines(rt, job_id)


def _receipts(pack: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]


def test_failed_job_steps(make_runtime: Callable[..., Any], tmp_path: Path) -> None:
    rt, job_id = run_job(make_runtime, "failed", tmp_path / "data")
    pack = export_pack(rt.store, job_id, tmp_path / "pack").pack_dir
    steps = {r["step_id"]: r for r in _receipts(pack) if r["type"] == F.STEP}
    by_node = {n["id"]: n["step_id"] for n in _trace_nodes(rt, job_id)}
    assert steps[by_node["a"]]["step_status"] == "PASS"
    assert steps[by_node["b"]]["step_status"] == "FAIL"
    assert steps[by_node["c"]]["step_status"] == "SKIPPED"
    assert steps[by_node["c"]]["output_hash"] is None
    assert not (pack / F.TRACES_DIR / f"{by_node['c']}.json").exists()
    # e never started although nothing it depends on failed: recorded as FAIL "not_run"
    assert steps[by_node["e"]]["step_status"] == "FAIL"
    trace = json.loads((pack / F.TRACES_DIR / f"{by_node['e']}.json").read_text())
    assert trace == {"outcome": "not_run", "job_status": "failed"}
    assert steps[F.EMIT_STEP_ID]["step_status"] == "SKIPPED"
    close = next(r for r in _receipts(pack) if r["type"] == F.CLOSE)
    assert close["all_steps_passed"] is False
    assert close["outputs_hash"] == F.h([])


def _trace_nodes(rt: Any, job_id: str) -> list[dict[str, Any]]:
    from affidavit.record._trace import job_trace

    nodes: list[dict[str, Any]] = job_trace(rt.store, job_id)["nodes"]
    return nodes


def test_layout_and_signature(make_runtime: Callable[..., Any], tmp_path: Path) -> None:
    rt, job_id = run_job(make_runtime, "refund", tmp_path / "data")
    pack = export_pack(rt.store, job_id, tmp_path / "pack").pack_dir
    names = {p.relative_to(pack).as_posix() for p in pack.rglob("*") if p.is_file()}
    for name in (*F.KERNEL_FILES, F.CONTRACT, "inputs/input.json", F.EVENTS):
        assert name in names
    manifest = json.loads((pack / F.MANIFEST).read_text())
    unsigned = {k: v for k, v in manifest.items() if k not in F.MANIFEST_UNSIGNED}
    signature = (pack / F.SIGNATURE).read_bytes()
    assert base64.b64decode(manifest["signature"]) == signature
    public = base64.b64decode(manifest["signer_pubkey"])
    Ed25519PublicKey.from_public_bytes(public).verify(signature, canonical(unsigned))
    # one key for seals and packs
    seal = rt.store.get_seal(job_id)
    assert manifest["signer_id"] == seal.key_id
    assert manifest["pack_root_sha256"] == F.sha256_hex(canonical(manifest["attestation"]))
    # receipts: sorted by seq, chained by parent_hashes, stored as JCS
    lines = (pack / F.RECEIPTS).read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(lines[:-1])
    receipts = [json.loads(line) for line in lines[:-1]]
    assert [r["seq"] for r in receipts] == list(range(len(receipts)))
    for line, receipt in zip(lines[:-1], receipts, strict=True):
        assert canonical(receipt) == line
    for prev, cur in itertools.pairwise(receipts):
        assert cur["parent_hashes"] == [F.receipt_hash(prev)]
    types = [r["type"] for r in receipts]
    assert types[0] == F.OPEN and F.CLOSE in types
    assert {F.EVENT_LOG, F.SEAL, F.LEDGER} <= set(types)
    events = (pack / F.EVENTS).read_bytes()
    log = next(r for r in receipts if r["type"] == F.EVENT_LOG)
    assert log["events_sha256"] == F.prefixed(events)
    assert log["event_count"] == len(events.splitlines()) == rt.get_job(job_id).version
    contract = json.loads((pack / F.CONTRACT).read_text())
    assert contract["episode_id"] == "ep_" + F.sha256_hex(job_id.encode())[:24]
    assert contract["inputs"][0]["hash"] == F.prefixed((pack / "inputs/input.json").read_bytes())


def test_worked_values_from_the_profile() -> None:
    env = {"provider": "openai", "model_id": "gpt-4o", "tool_versions": {"assay": "1.20.2"}}
    env["container_digest"] = None  # type: ignore[assignment]
    assert F.h(F.env_fingerprint_input(env)) == (
        "sha256:7b3b0feedebafe57b0dfa41383ee67571ea9cac3926181b3a1ee4a7a9bef212b"
    )
    assert F.h({"value": 42}) == (
        "sha256:dc60e632a90329ccfd34fbe904d94704dbbb6669575185e26389854ff64139c3"
    )
    assert F.h([]) == "sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"


def test_refuses_unfinished_job_and_existing_dir(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    rt = make_runtime(tools())
    pending = rt.submit(
        {"name": "p", "nodes": [{"id": "a", "type": "tool", "tool": "charge", "args": {}}]}, {}
    )
    with pytest.raises(UnfinishedJobError, match="pending"):
        export_pack(rt.store, pending.job_id, tmp_path / "never")
    assert not (tmp_path / "never").exists()
    rt.run_until_idle()
    out = tmp_path / "pack"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(PackExistsError):
        export_pack(rt.store, pending.job_id, out)
    assert (out / "keep").exists()
    first = export_pack(rt.store, pending.job_id, out, overwrite=True)
    assert not (out / "keep").exists() and (out / F.MANIFEST).exists()
    # no staging or old directories left behind
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert first.pack_root_sha256


def test_cli_export(make_runtime: Callable[..., Any], tmp_path: Path, store_url: str) -> None:
    _, job_id = run_job(make_runtime, "charges", tmp_path / "data")
    runner = CliRunner()
    out = tmp_path / "pack"
    res = runner.invoke(app, ["pack", "export", job_id, str(out), "--db", store_url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["pack_dir"] == str(out)
    assert doc["pack_root_sha256"] == json.loads((out / F.MANIFEST).read_text())["pack_root_sha256"]
    again = runner.invoke(app, ["pack", "export", job_id, str(out), "--db", store_url, "--json"])
    assert again.exit_code == 3
    assert json.loads(again.stdout)["error"]["code"] == "pack_exists"
    missing = runner.invoke(app, ["pack", "export", "nope", str(tmp_path / "x"), "--db", store_url])
    assert missing.exit_code == 2


class _Crash(BaseException):
    """Stands for the process dying at that point (not an Exception: nothing handles it)."""


def test_a_crash_before_the_rename_leaves_no_pack(
    make_runtime: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, job_id = run_job(make_runtime, "charges", tmp_path / "data")
    out = tmp_path / "packs" / "pack"

    def crash(*args: Any) -> None:
        raise _Crash

    import affidavit.packs.export as export_module

    with monkeypatch.context() as patched, pytest.raises(_Crash):
        patched.setattr(export_module.os, "rename", crash)
        export_pack(rt.store, job_id, out)
    assert not out.exists()
    assert list((tmp_path / "packs").iterdir()) == []  # the staging directory is gone too
    assert export_pack(rt.store, job_id, out).pack_dir == out
