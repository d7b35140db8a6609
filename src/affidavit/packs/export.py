"""``export_pack``: a finished job as a signed RCE v0.1 proof pack (PACK-FORMAT.md).

The pack is written into a staging directory next to ``out_dir`` and renamed into place, so a
crash never leaves half a pack at ``out_dir``. It is signed with the runtime's seal key, so one
public key checks both the job's seal and the pack.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from affidavit.core.canonical import canonical, has_exponent_number
from affidavit.core.errors import AffidavitError, ConfigError
from affidavit.core.events import utc_now
from affidavit.core.signing import SigningKey, default_key_path
from affidavit.packs import _format as F
from affidavit.packs._tlog import TLOG_PROOF
from affidavit.runtime import AgentOutcome, ReplayContext, agent_trace_of, is_agent_log, trace_of
from affidavit.store import TERMINAL_STATUSES, Store, StoredEvent
from affidavit.tlog import LogError, NotInLog, TransparencyLog
from affidavit.verify import verify_events

COMPLETED_STATES = frozenset({"pure", "side_effect_committed", "compensated"})


class PackError(AffidavitError):
    """A pack cannot be exported (the job is unfinished, the target exists, ...)."""

    code = "pack_error"
    http_status = 409
    default_hint = "See docs/packs.md."


class UnfinishedJobError(PackError):
    code = "job_not_finished"
    default_hint = "Only finished jobs export: wait for the job to complete or fail."


class PackExistsError(PackError):
    code = "pack_exists"
    default_hint = "Choose another directory, or pass --overwrite to replace it."


@dataclass(frozen=True, slots=True)
class ExportResult:
    pack_dir: Path
    pack_root_sha256: str
    # The steps whose trace holds a number in exponent form (1e-7, 1e+21): assay's verifier
    # canonicalizes those otherwise than RFC 8785 and reports such steps as diverging.
    assay_diverging_steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"pack_dir": str(self.pack_dir), "pack_root_sha256": self.pack_root_sha256}


def _affidavit_version() -> str:
    return _dist_version("affidavit")


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def _ms(value: Any) -> int:
    try:
        return max(0, round(float(value or 0)))
    except (TypeError, ValueError):
        return 0


def export_pack(
    store: Store,
    job_id: str,
    out_dir: Path | str,
    *,
    signing_key: SigningKey | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Export the finished job ``job_id`` as a signed pack at ``out_dir``.

    ``signing_key`` defaults to the runtime's seal key for this database (see
    :func:`affidavit.runtime._sealing.default_key_path`).

    Raises:
        JobNotFound: no such job.
        UnfinishedJobError: the job is not completed, failed or cancelled.
        PackExistsError: ``out_dir`` exists and ``overwrite`` is false.
        PackError: the job's log does not verify (a pack of it would not either).
        SigningKeyError: the signing key cannot be read.
    """
    out = Path(out_dir)
    job = store.get_job(job_id)
    if job.status not in TERMINAL_STATUSES:
        raise UnfinishedJobError(
            f"job {job_id} is {job.status}; only finished jobs (completed, failed, cancelled) "
            "can be exported"
        )
    if out.exists() and not overwrite:
        raise PackExistsError(f"{str(out)!r} already exists")
    if signing_key is None:
        path = default_key_path(store.url)
        if not path.exists():
            raise ConfigError(
                f"no signing key at {str(path)!r}",
                hint="Export on a machine that holds the runtime's seal key "
                "($AFFIDAVIT_SIGNING_KEY).",
            )
        signing_key = SigningKey.load(path)

    events = store.list_events(job_id)
    log: ReplayContext | AgentOutcome
    if is_agent_log(events):  # one step per recorded call, in sequence order
        trace, log = agent_trace_of(job, events)
    else:
        trace, log = trace_of(job, events)  # one read and one replay of the log serve the pack
    with store.snapshot() as snap:
        ledger = snap.ledger_list(job_id)
    seal = store.get_seal(job_id)
    keys = store.signing_keys()
    check = verify_events(
        events, public_keys=keys, seal=seal, ledger=ledger, status=job.status, job_id=job_id
    )
    if not check.ok:
        raise PackError(
            f"job {job_id} does not verify; refusing to export it",
            hint=f"Run `affidavit verify {job_id}` to see what is wrong.",
        )
    assert seal is not None  # a verified terminal job has a seal
    built = _build(job, trace, log, events, ledger, seal, keys, check, signing_key)
    # the job's transparency-log proof, when its seal is in the log (see packs._tlog)
    with contextlib.suppress(NotInLog, LogError):
        built.files[TLOG_PROOF] = TransparencyLog(store).job_proof(job_id).encode().encode()

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=".affidavit-pack-"))
    try:
        for rel, data in built.files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        _publish(staging, out, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(out, built.pack_root, tuple(built.exponent_steps))


def pack_archive(store: Store, job_id: str, *, signing_key: SigningKey | None = None) -> bytes:
    """The pack of ``job_id`` as the bytes of a ``.tar.gz`` holding one directory
    ``pack-<job_id>/`` (what ``GET /api/jobs/{id}/pack`` serves). Raises as :func:`export_pack`.
    """
    return export_archive(store, job_id, signing_key=signing_key)[0]


def export_archive(
    store: Store, job_id: str, *, signing_key: SigningKey | None = None
) -> tuple[bytes, ExportResult]:
    """:func:`pack_archive` and the :class:`ExportResult` of the export (its ``pack_dir``, a
    temporary directory, is gone by then). Raises as :func:`export_pack`."""
    import io
    import tarfile

    with tempfile.TemporaryDirectory(prefix="affidavit-pack-") as tmp:
        name = f"pack-{job_id}"
        result = export_pack(store, job_id, Path(tmp) / name, signing_key=signing_key)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(result.pack_dir, arcname=name)
        return buffer.getvalue(), result


def _publish(staging: Path, out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise PackExistsError(f"{str(out)!r} already exists")
        trash = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out, trash)
        os.rename(staging, out)
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
        return
    os.rename(staging, out)


@dataclass
class _Built:
    files: dict[str, bytes]
    pack_root: str
    exponent_steps: list[str]  # see ExportResult.assay_diverging_steps


def _event_lines(job_id: str, events: Sequence[StoredEvent]) -> bytes:
    """``events.ndjson``: per event, the JCS bytes of ``{"job_id", "version", "event_id",
    "type", "payload", "chain_hash"}`` and a newline. The store writes each payload as its JCS
    bytes (and the chain verified before export proves them unchanged), so they are spliced in
    as stored rather than parsed and encoded again; orjson writes a string exactly as JCS does (or
    refuses it, as JCS does a lone surrogate). The keys are in JCS order."""
    job = orjson.dumps(job_id)
    dumps = orjson.dumps
    return b"".join(
        b'{"chain_hash":%b,"event_id":%b,"job_id":%b,"payload":%b,"type":%b,"version":%d}\n'
        % (dumps(e.chain_hash), dumps(e.event_id), job, e.payload_bytes, dumps(e.type), e.version)
        for e in events
    )


def _build(
    job: Any,
    trace: dict[str, Any],
    log: ReplayContext | AgentOutcome,
    events: list[Any],
    ledger: list[Any],
    seal: Any,
    keys: list[Any],
    check: Any,
    signing_key: SigningKey,
) -> _Built:
    job_id: str = job.job_id
    files: dict[str, bytes] = {}
    job_input = events[0].payload.get("input") if events else None
    input_bytes = canonical(job_input)
    files[f"{F.INPUTS_DIR}/{F.INPUT_REF}"] = input_bytes

    nodes: list[dict[str, Any]] = trace["nodes"]
    if trace.get("kind") == "agent":
        # an agent job's steps depend on the input only (none blocks another: the agent may
        # have caught a failure and gone on); its output on every step that passed
        step_of = {
            n["id"]: F.agent_pack_step_id(n["seq"], str(n["step_id"]), len(nodes)) for n in nodes
        }
        sinks = [step_of[n["id"]] for n in nodes if _passes(n)]
    else:
        step_of = {n["id"]: str(n["step_id"]) for n in nodes}
    node_by_step = {step_of[n["id"]]: n for n in nodes}
    deps_of: dict[str, list[str]] = {
        step_of[n["id"]]: [step_of[d] for d in n["depends_on"]] for n in nodes
    }
    if trace.get("kind") != "agent":
        has_children = {d for ds in deps_of.values() for d in ds}
        sinks = sorted(s for s in deps_of if s not in has_children)

    # --- the episode contract ------------------------------------------------------------------
    tool_versions = {"affidavit": _affidavit_version()}
    environment = {
        "provider": "none",
        "model_id": "none",
        "tool_versions": tool_versions,
        "container_digest": None,
    }
    environment["env_fingerprint_hash"] = F.h(F.env_fingerprint_input(environment))
    inputs = [
        {"ref": F.INPUT_REF, "hash": F.prefixed(input_bytes), "media_type": "application/json"}
    ]
    script_steps: list[dict[str, Any]] = [
        {
            "step_id": F.LOAD_STEP_ID,
            "opcode": "LOAD_INPUT",
            "params": {"ref": F.INPUT_REF},
            "depends_on": [],
        }
    ]
    for n in nodes:
        sid = step_of[n["id"]]
        script_steps.append(
            {
                "step_id": sid,
                "opcode": "APPLY_TRANSFORM",
                "params": {"transform": f"{n['type']}:{n.get('tool') or ''}"},
                "depends_on": deps_of[sid] or [F.LOAD_STEP_ID],
            }
        )
    script_steps.append(
        {
            "step_id": F.EMIT_STEP_ID,
            "opcode": "EMIT_OUTPUT",
            "params": {"claim_type": "job_output", "output_ref": "output.json"},
            "depends_on": sinks or [F.LOAD_STEP_ID],
        }
    )
    replay_script = {"schema_version": "replay_script/0.1", "steps": script_steps}
    replay_policy = {"replay_basis": "recorded_trace", "comparator_tier": "A"}
    contract: dict[str, Any] = {
        "schema_version": "rce/0.1",
        "episode_id": "ep_" + F.sha256_hex(job_id.encode())[:24],
        "objective": str(job.plan_name or f"affidavit job {job_id}"),
        "inputs": inputs,
        "replay_script": replay_script,
        "replay_policy": replay_policy,
        "environment": environment,
    }
    episode_id: str = contract["episode_id"]
    spec_hash = F.h(F.episode_spec_view(contract))
    files[F.CONTRACT] = canonical(contract)

    # --- step statuses and traces, in DAG order -------------------------------------------------
    all_deps = {s["step_id"]: list(s["depends_on"]) for s in script_steps}
    order = F.kahn_order(list(all_deps), all_deps)
    assert order is not None  # a plan is a DAG
    status: dict[str, str] = {}
    exponent_steps: list[str] = []
    out_hash: dict[str, str | None] = {}
    payloads: list[dict[str, Any]] = []
    timestamps: dict[str, str] = {}
    created_at = str(events[0].payload.get("at") or job.created_at)
    ended_at = str(events[-1].payload.get("at") or job.updated_at)
    for sid in order:
        deps = all_deps[sid]
        blocked = any(status[d] != "PASS" for d in deps)
        trace_value: Any = None
        duration = 0
        ts = created_at
        if sid == F.LOAD_STEP_ID:
            opcode, st, trace_value = "LOAD_INPUT", "PASS", job_input
        elif sid == F.EMIT_STEP_ID:
            opcode, ts = "EMIT_OUTPUT", ended_at
            if blocked:
                st = "SKIPPED"
            elif log.status == "completed":
                st, trace_value = "PASS", {"claim_type": "job_output", "output": log.output}
            else:
                st = "FAIL"
                trace_value = {"claim_type": "job_output", "status": log.status, "error": log.error}
        else:
            opcode = "APPLY_TRANSFORM"
            n = node_by_step[sid]
            ts = n.get("finished_at") or n.get("started_at") or ended_at
            if blocked:
                st, ts = "SKIPPED", ended_at
            elif _passes(n):
                st, trace_value = "PASS", n["output"]
                duration = _ms(n.get("duration_ms"))
            elif n.get("started_at") is not None:
                st = "FAIL"
                trace_value = {"outcome": n.get("outcome"), "error": n.get("error")}
                duration = _ms(n.get("duration_ms"))
            else:
                # Never started, with no failed dependency: the job ended first.
                st = "FAIL"
                trace_value = {"outcome": "not_run", "job_status": job.status}
        status[sid] = st
        payload: dict[str, Any] = {
            "episode_id": episode_id,
            "step_id": sid,
            "opcode": opcode,
            "step_status": st,
            "comparator_tier": "A",
        }
        if st == "SKIPPED":
            out_hash[sid] = None
            payload.update(input_hashes=[], output_hash=None, output_size_bytes=0, duration_ms=0)
        else:
            trace_bytes = canonical(trace_value)
            if has_exponent_number(trace_bytes):
                exponent_steps.append(sid)
            files[f"{F.TRACES_DIR}/{sid}.json"] = trace_bytes
            out_hash[sid] = F.prefixed(trace_bytes)
            payload.update(
                input_hashes=[out_hash[d] for d in deps],
                output_hash=out_hash[sid],
                output_size_bytes=len(trace_bytes),
                duration_ms=duration,
            )
        payloads.append(payload)
        timestamps[sid] = str(ts)

    # --- receipts --------------------------------------------------------------------------------
    events_bytes = _event_lines(job_id, events)
    files[F.EVENTS] = events_bytes
    receipts: list[dict[str, Any]] = []

    def add(rtype: str, ts: str, body: dict[str, Any]) -> None:
        seq = len(receipts)
        receipt = {
            "receipt_id": f"r_{F.sha256_hex(f'{job_id}:{seq}'.encode())[:24]}",
            "type": rtype,
            "timestamp": ts,
            "schema_version": "3.0",
            "seq": seq,
            "proof_tier": "core",
            "parent_hashes": [F.receipt_hash(receipts[-1])] if receipts else [],
            "run_id": job_id,
            **body,
        }
        receipts.append(receipt)

    n_steps = len(script_steps)
    add(
        F.OPEN,
        created_at,
        {
            "episode_id": episode_id,
            "episode_spec_hash": spec_hash,
            "objective": contract["objective"],
            "inputs_hash": F.h(inputs),
            "script_hash": F.h(replay_script),
            "env_fingerprint_hash": environment["env_fingerprint_hash"],
            "replay_basis": "recorded_trace",
            "comparator_tier": "A",
            "n_steps": n_steps,
        },
    )
    for payload in payloads:
        add(F.STEP, timestamps[payload["step_id"]], payload)
    n_passed = sum(1 for p in payloads if p["step_status"] == "PASS")
    add(
        F.CLOSE,
        ended_at,
        {
            "episode_id": episode_id,
            "episode_spec_hash": spec_hash,
            "outputs_hash": F.outputs_hash(payloads),
            "n_steps_executed": sum(1 for p in payloads if p["step_status"] != "SKIPPED"),
            "n_steps_passed": n_passed,
            "all_steps_passed": n_passed == n_steps,
            "replay_basis": "recorded_trace",
            "comparator_tier": "A",
        },
    )
    add(
        F.EVENT_LOG,
        ended_at,
        {
            "events_sha256": F.prefixed(events_bytes),
            "event_count": len(events),
            "event_chain_root_hash": check.event_chain_root_hash,
            "execution_hash": check.execution_hash,
            "plan_hash": trace.get("plan_hash"),
            "job_status": job.status,
        },
    )
    key_by_id = {k.key_id: k for k in keys}
    seal_key = key_by_id[seal.key_id]
    add(
        F.SEAL,
        str(seal.sealed_at),
        {"seal": seal.to_dict(), "public_key": seal_key.public_key_b64},
    )
    add(
        F.LEDGER,
        ended_at,
        {
            "rows": [
                {
                    "idempotency_key": r.idempotency_key,
                    "step_id": r.step_id,
                    "status": r.status,
                    "invocation_id": r.invocation_id,
                    "result_hash": _result_hash(r.result),
                }
                for r in sorted(ledger, key=lambda r: r.idempotency_key)
            ]
        },
    )
    lines = [canonical(F.receipt_body(r)) for r in receipts]
    receipt_bytes = b"\n".join(lines) + b"\n"
    files[F.RECEIPTS] = receipt_bytes

    # --- attestation, report, transcript, manifest, signature ----------------------------------
    now = datetime.now(UTC)
    pack_id = f"pack_{now.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:8]}"
    stamps = [str(r["timestamp"]) for r in receipts]
    suite_id = "affidavit"
    version = _affidavit_version()
    attestation = {
        "pack_format_version": "0.1.0",
        "fingerprint_version": 1,
        "pack_id": pack_id,
        "run_id": job_id,
        "suite_id": suite_id,
        "suite_hash": F.sha256_hex(suite_id.encode()),
        "verifier_version": version,
        "canon_version": "jcs-rfc8785",
        "canon_impl": "rfc8785",
        "canon_impl_version": _dist_version("rfc8785"),
        "policy_hash": F.sha256_hex(canonical(trace.get("policy"))),
        "claim_set_id": "none",
        "claim_set_hash": F.sha256_hex(b"none"),
        "receipt_integrity": "PASS",
        "claim_check": "N/A",
        "discrepancy_fingerprint": None,
        "assurance_level": "L0",
        "proof_tier": "signed-pack",
        "mode": "shadow",
        "head_hash": F.sha256_hex(lines[-1]),
        "head_hash_algorithm": "last-receipt-digest-v0",
        "time_authority": "local_clock",
        "n_receipts": len(receipts),
        "timestamp_start": min(stamps),
        "timestamp_end": max(stamps),
        "ci_binding": None,
        "valid_until": None,
        "superseded_by": None,
    }
    attestation_sha256 = F.sha256_hex(canonical(attestation))
    report = {
        "passed": True,
        "errors": [],
        "warnings": [],
        "receipt_count": len(receipts),
        "head_hash": attestation["head_hash"],
        "verified_at": utc_now(),
        "verifier": {"name": "affidavit", "version": version},
        "pack_id": pack_id,
        "run_id": job_id,
        "pack_root_sha256": attestation_sha256,
        "receipt_pack_sha256": F.sha256_hex(receipt_bytes),
        "job_verification": check.to_dict(),
    }
    report_bytes = canonical(report)
    files[F.REPORT] = report_bytes
    transcript = _transcript(job, pack_id, attestation, payloads, check)
    files[F.TRANSCRIPT] = transcript
    files[f"{F.UNSIGNED_DIR}/PACK_SUMMARY.md"] = transcript

    public_raw = signing_key.public_raw
    unsigned = {
        "pack_id": pack_id,
        "pack_version": "0.1.0",
        "manifest_version": "1.0.0",
        "hash_alg": "sha256",
        "attestation": attestation,
        "attestation_sha256": attestation_sha256,
        "suite_hash": attestation["suite_hash"],
        "claim_set_id": attestation["claim_set_id"],
        "claim_set_hash": attestation["claim_set_hash"],
        "receipt_count_expected": len(receipts),
        # the event log among the hash-covered files: assay's verifier checks the SHA-256 of
        # every file listed here (it reads nothing else of events.ndjson), ours re-verifies it
        "files": [
            {"path": name, "sha256": F.sha256_hex(files[name]), "bytes": len(files[name])}
            for name in (*F.HASHED_KERNEL_FILES, F.EVENTS)
        ],
        "expected_files": list(F.KERNEL_FILES),
        "signer_id": signing_key.key_id,
        "signer_pubkey": base64.b64encode(public_raw).decode("ascii"),
        "signer_pubkey_sha256": F.sha256_hex(public_raw),
        "signature_alg": "ed25519",
        "signature_scope": F.SIGNATURE_SCOPE,
    }
    signature = signing_key.private.sign(canonical(unsigned))
    manifest = {
        **unsigned,
        "signature": base64.b64encode(signature).decode("ascii"),
        "pack_root_sha256": attestation_sha256,
    }
    import json

    files[F.MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    files[F.SIGNATURE] = signature
    return _Built(files, attestation_sha256, exponent_steps)


def _passes(node: dict[str, Any]) -> bool:
    """Whether a traced node is a PASS step: completed, with its output recorded."""
    return node["state"] in COMPLETED_STATES and "output" in node


def _result_hash(result: Any) -> str | None:
    try:
        return F.sha256_hex(canonical(result))
    except AffidavitError:
        return None


def _transcript(
    job: Any,
    pack_id: str,
    attestation: dict[str, Any],
    payloads: list[dict[str, Any]],
    check: Any,
) -> bytes:
    counts: dict[str, int] = {}
    for p in payloads:
        counts[p["step_status"]] = counts.get(p["step_status"], 0) + 1
    lines = [
        f"# Proof pack {pack_id}",
        "",
        f"- job: `{job.job_id}` ({job.status}), plan `{job.plan_name}`",
        f"- receipts: {attestation['n_receipts']}, head hash `{attestation['head_hash']}`",
        "- steps: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        f"- event chain root `{check.event_chain_root_hash}`",
        f"- execution hash `{check.execution_hash}`",
        "",
        "Verify offline: `affidavit pack verify PACK_DIR --out-dir OUT` "
        "(or `assay rce-verify PACK_DIR --out-dir OUT`).",
        "",
    ]
    return "\n".join(lines).encode()
