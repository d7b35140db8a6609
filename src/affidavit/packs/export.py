"""``export_pack``: a finished job as a signed RCE v0.1 proof pack (docs/packs.md, "Export").

The pack is written into a staging directory next to ``out_dir`` and renamed into place, so a
crash never leaves half a pack at ``out_dir``. It is signed with the runtime's seal key, so one
public key checks both the job's seal and the pack.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from affidavit.core.canonical import canonical
from affidavit.core.errors import ConfigError
from affidavit.core.seal import PublicKey, Seal
from affidavit.core.signing import SigningKey, default_key_path
from affidavit.packs import _format as F
from affidavit.packs._errors import PackError, PackExistsError, TraceStateError, UnfinishedJobError
from affidavit.packs._export_manifest import (
    attestation_of,
    dist_version,
    report_of,
    sign_manifest,
    transcript_of,
)
from affidavit.packs._export_receipts import Receipts, add_episode, add_job_records
from affidavit.packs._export_steps import StepRecords, contract_of, episode_of, step_records
from affidavit.packs._tlog import TLOG_PROOF
from affidavit.record import AgentOutcome, ReplayContext, agent_trace_of, is_agent_log, trace_of
from affidavit.store import TERMINAL_STATUSES, JobRecord, LedgerRow, Store, StoredEvent
from affidavit.tlog import LogError, NotInLog, TransparencyLog
from affidavit.verify import VerificationResult, verify_events

__all__ = [
    "ExportResult",
    "PackError",
    "PackExistsError",
    "TraceStateError",
    "UnfinishedJobError",
    "export_archive",
    "export_pack",
    "pack_archive",
]


@dataclass(frozen=True, slots=True)
class ExportResult:
    pack_dir: Path
    pack_root_sha256: str
    # The steps whose trace holds a number in exponent form (1e-7, 1e+21): assay's verifier
    # canonicalizes those otherwise than RFC 8785 and reports such steps as diverging.
    assay_diverging_steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"pack_dir": str(self.pack_dir), "pack_root_sha256": self.pack_root_sha256}


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
    :func:`affidavit.record._sealing.default_key_path`).

    Raises:
        JobNotFound: no such job.
        UnfinishedJobError: the job is not completed, failed or cancelled.
        PackExistsError: ``out_dir`` exists and ``overwrite`` is false.
        PackError: the job's log does not verify (a pack of it would not either).
        TraceStateError: a node of the job's trace is in a state no step status is defined
            for (``affidavit.record.NODE_STATE_KINDS``); nothing is written.
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
    built = _build(_Verified(job, trace, log, events, ledger, seal, keys, check), signing_key)
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


@dataclass(frozen=True, slots=True)
class _Verified:
    """What a pack is built from: the finished ``job``, verified (``check``) from the records
    read for it — its trace and its replayed log (``log``), its events, ledger rows, seal and
    the recorded keys."""

    job: JobRecord
    trace: dict[str, Any]
    log: ReplayContext | AgentOutcome
    events: list[StoredEvent]
    ledger: list[LedgerRow]
    seal: Seal
    keys: list[PublicKey]
    check: VerificationResult

    @property
    def times(self) -> tuple[str, str]:
        """The job's creation and end, as its first and last events record them."""
        first, last = self.events[0].payload, self.events[-1].payload
        return str(first.get("at") or self.job.created_at), str(
            last.get("at") or self.job.updated_at
        )


def _build(record: _Verified, signing_key: SigningKey) -> _Built:
    """Every file of the pack of the verified finished job, by pack section."""
    files: dict[str, bytes] = {}
    events = record.events
    job_input = events[0].payload.get("input") if events else None
    input_bytes = canonical(job_input)
    files[f"{F.INPUTS_DIR}/{F.INPUT_REF}"] = input_bytes
    episode = episode_of(record.trace)
    contract = contract_of(
        record.job, input_bytes, episode.script_steps, {"affidavit": dist_version("affidavit")}
    )
    files[F.CONTRACT] = canonical(contract)
    steps = step_records(
        episode, contract["episode_id"], record.job, job_input, record.log, record.times
    )
    for sid, trace_bytes in steps.traces.items():
        files[f"{F.TRACES_DIR}/{sid}.json"] = trace_bytes
    receipts = _receipts(record, contract, steps, files)
    return _Built(files, _sign(record, receipts, steps, files, signing_key), steps.exponent_steps)


def _receipts(
    record: _Verified, contract: dict[str, Any], steps: StepRecords, files: dict[str, bytes]
) -> Receipts:
    """The receipts of the episode and of the job's records; writes the events and the
    receipt pack into ``files``."""
    job, check, times = record.job, record.check, record.times
    events_bytes = _event_lines(job.job_id, record.events)
    files[F.EVENTS] = events_bytes
    receipts = Receipts(job.job_id)
    add_episode(receipts, contract, steps.payloads, steps.timestamps, times)
    log_body = {
        "events_sha256": F.prefixed(events_bytes),
        "event_count": len(record.events),
        "event_chain_root_hash": check.event_chain_root_hash,
        "execution_hash": check.execution_hash,
        "plan_hash": record.trace.get("plan_hash"),
        "job_status": job.status,
    }
    add_job_records(receipts, times[1], log_body, record.seal, record.keys, record.ledger)
    return receipts


def _sign(
    record: _Verified,
    receipts: Receipts,
    steps: StepRecords,
    files: dict[str, bytes],
    signing_key: SigningKey,
) -> str:
    """The receipt pack, the report, the transcript and the signed manifest into ``files``;
    returns the pack root (the SHA-256 of the attestation's JCS)."""
    job, check = record.job, record.check
    lines = receipts.lines()
    receipt_bytes = b"\n".join(lines) + b"\n"
    files[F.RECEIPTS] = receipt_bytes
    attestation = attestation_of(job.job_id, record.trace.get("policy"), receipts.items, lines)
    files[F.REPORT] = canonical(report_of(attestation, receipt_bytes, check))
    transcript = transcript_of(job, attestation, steps.payloads, check)
    files[F.TRANSCRIPT] = transcript
    files[f"{F.UNSIGNED_DIR}/PACK_SUMMARY.md"] = transcript
    files[F.MANIFEST], files[F.SIGNATURE] = sign_manifest(attestation, files, signing_key)
    return F.sha256_hex(canonical(attestation))
