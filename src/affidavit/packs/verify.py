"""``verify_pack``: phases 1–5 of docs/packs.md ("Verification") on a pack directory, offline.

Every check of a phase runs and every error is collected; the first phase with errors decides
the verdict. Nothing in a pack — missing files, bytes that are not UTF-8 or not JSON, values of
the wrong type, path escapes — makes this module raise: each is an ``INTEGRITY_FAIL`` with a
reason in ``errors``.

The phases live in their own modules: (1) :mod:`~affidavit.packs._contract`, (2)
:mod:`~affidavit.packs._integrity`, (3) and (4) :mod:`~affidavit.packs._episode`, (5)
:mod:`~affidavit.packs._eventlog`; this one runs them in order and writes the verdict.
"""

from __future__ import annotations

import base64
import binascii
import json
import platform
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.core.canonical import canonical
from affidavit.core.collector import collector_paused
from affidavit.core.config import pack_max_file_bytes
from affidavit.core.errors import AffidavitError
from affidavit.core.seal import PublicKey
from affidavit.packs import _format as F
from affidavit.packs._contract import check_contract
from affidavit.packs._episode import check_completeness, compare, contract_hash
from affidavit.packs._errors import PackArchiveError
from affidavit.packs._eventlog import check_event_log
from affidavit.packs._integrity import check_integrity
from affidavit.packs._schemas import contract_schema_errors, schema_errors
from affidavit.packs._state import (
    DIVERGE,
    EPISODE,
    EXIT_CODES,
    HEX64,
    INTEGRITY_FAIL,
    MATCH,
    Fail,
    State,
)
from affidavit.packs._tlog import check_log_proof
from affidavit.packs.archive import ArchiveLimits, read_pack_archive, write_members

if TYPE_CHECKING:
    from affidavit.core.note import Verifier

__all__ = [
    "DIVERGE",
    "EXIT_CODES",
    "INTEGRITY_FAIL",
    "MATCH",
    "PackVerdict",
    "contract_schema_errors",
    "result_errors",
    "schema_errors",
    "verify_pack",
    "write_verdict",
]


@dataclass
class PackVerdict:
    """The outcome of :func:`verify_pack`: ``verdict`` and ``exit_code`` (0 MATCH, 1 DIVERGE,
    2 INTEGRITY_FAIL), the replay-result receipt and the details document."""

    verdict: str
    exit_code: int
    phase: int
    errors: list[str]
    receipt: dict[str, Any]
    details: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.verdict == MATCH


def _version() -> str:
    from importlib import metadata  # (~60 ms to import: only once a receipt is written)

    try:
        return metadata.version("affidavit")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _receipt(
    st: State,
    verdict: str,
    *,
    parents: list[str],
    replayed: int = 0,
    divergent: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    contract = st.contract or {}
    episode_id = contract.get("episode_id")
    root = (st.manifest or {}).get("pack_root_sha256")

    def safe(name: str) -> str:
        try:
            return contract_hash(st, name)
        except Fail:
            return "sha256:" + "0" * 64

    divergent = divergent or []
    version = _version()
    receipt: dict[str, Any] = {
        "type": F.REPLAY_RESULT,
        "timestamp": datetime.now(UTC).isoformat(),
        "schema_version": "3.0",
        "proof_tier": "core",
        "parent_hashes": parents,
        "episode_id": episode_id
        if isinstance(episode_id, str) and EPISODE.match(episode_id)
        else "ep_" + "0" * 24,
        "episode_spec_hash": safe("episode_spec_hash"),
        "original_pack_root_sha256": "sha256:"
        + (root if isinstance(root, str) and HEX64.match(root) else "0" * 64),
        "verdict": verdict,
        "receipt_integrity": "FAIL" if verdict == INTEGRITY_FAIL else "PASS",
        "claim_check": None
        if verdict == INTEGRITY_FAIL
        else ("PASS" if verdict == MATCH else "FAIL"),
        "replay_basis": "recorded_trace",
        "comparator_tier": "A",
        "script_hash": safe("script_hash"),
        "steps_replayed": replayed,
        "steps_matched": replayed - len(divergent),
        "steps_diverged": len(divergent),
        "divergent_step_ids": [d["step_id"] for d in divergent],
        "verifier_id": F.VERIFIER_ID,
        "verifier_version": version,
        "verifier_env_hash": F.h(
            {
                "platform": platform.platform(),
                "python_version": sys.version.split()[0],
                "verifier_id": F.VERIFIER_ID,
                "verifier_version": version,
            }
        ),
        "dispute": {"divergent_steps": divergent, "replay_pack_root_sha256": None}
        if verdict == DIVERGE
        else None,
    }
    receipt["receipt_id"] = "r_rce_replay_" + F.sha256_hex(canonical(receipt))[:12]
    receipt["receipt_hash"] = F.receipt_hash(receipt)
    return receipt


def result_errors(receipt: dict[str, Any]) -> list[str]:
    """Schema and consistency errors of a replay-result receipt (empty when it is valid)."""
    errors = schema_errors(F.SCHEMA_NAMES[3], receipt)
    if errors:
        return errors
    verdict = receipt["verdict"]
    if receipt["steps_matched"] + receipt["steps_diverged"] != receipt["steps_replayed"]:
        errors.append("steps_matched + steps_diverged != steps_replayed")
    if len(receipt["divergent_step_ids"]) != receipt["steps_diverged"]:
        errors.append("divergent_step_ids does not match steps_diverged")
    expect = {MATCH: ("PASS", "PASS"), DIVERGE: ("PASS", "FAIL"), INTEGRITY_FAIL: ("FAIL", None)}
    if (receipt["receipt_integrity"], receipt["claim_check"]) != expect[verdict]:
        errors.append(f"receipt_integrity/claim_check do not fit {verdict}")
    if verdict == DIVERGE and not (receipt["dispute"] or {}).get("divergent_steps"):
        errors.append("a DIVERGE result needs divergent steps")
    if verdict != DIVERGE and receipt["dispute"] is not None:
        errors.append(f"a {verdict} result has no dispute")
    if verdict != INTEGRITY_FAIL and len(receipt["parent_hashes"]) != 1:
        errors.append("parent_hashes must name the close receipt")
    return errors


def verify_pack(
    path: Path | str,
    *,
    trusted_keys: Iterable[bytes | str] | None = None,
    now: datetime | None = None,
    max_file_bytes: int | None = None,
    log_key: Verifier | None = None,
    witness_keys: Sequence[Verifier] = (),
    min_witnesses: int | None = None,
    log_url: str | None = None,
    fork_source: Path | str | None = None,
) -> PackVerdict:
    """Verify the pack directory at ``path`` (phases 1–5 of docs/packs.md), or the pack archive
    (``.tar.gz``) at ``path``: read whole and checked first (:mod:`~affidavit.packs.archive`),
    a corrupted or refused archive being INTEGRITY_FAIL with the reason. Never raises on a
    malformed pack.

    ``trusted_keys`` (raw 32-byte Ed25519 public keys or their base64) pins the accepted
    signers — of the pack, and of the job's seal in it; without it the pack is self-attested
    and the details name the signer's key id. ``max_file_bytes``: the most one file of the pack
    may hold (default ``$AFFIDAVIT_PACK_MAX_FILE_BYTES``, else 256 MiB); a larger one is an
    integrity failure, found by its size before it is read.

    ``log_key`` adds a phase checking the job's transparency-log proof (``log.tlog-proof``): the
    log's signature, ``witness_keys``' cosignatures (all of them, unless ``min_witnesses``) and
    the inclusion of the pack's seal; any failure is INTEGRITY_FAIL. With ``log_url`` (the log's
    base URL) it also reads every leaf before the pack's and fails if one is the same job's
    (the details' ``first_for_job`` says what was proven; see docs/transparency.md).

    A fork's pack (its job reused a source job's steps) has ``details["fork"]``: its source is
    ``unverified`` ("source not checked"), unless ``fork_source`` is the source's pack (a
    directory or archive): then the prefix is checked against it, and a prefix it does not
    hold is INTEGRITY_FAIL (:mod:`affidavit.packs._fork`).

    Raises:
        ConfigError: ``max_file_bytes`` (or its variable) is not a positive whole number.
    """
    limit = pack_max_file_bytes(max_file_bytes)
    source = None if fork_source is None else Path(fork_source)
    log_check = (log_key, witness_keys, min_witnesses, log_url)
    where = Path(path)
    if where.is_file():  # a .tar.gz: read whole, checked, and verified from a temp directory
        return _verify_archive(where, trusted_keys, now, limit, log_check, source)
    with collector_paused():  # hundreds of thousands of parsed objects, no cycles
        return _verify(where, trusted_keys, now, limit, log_check, fork_source=source)


def _verify_archive(
    path: Path,
    trusted_keys: Iterable[bytes | str] | None,
    now: datetime | None,
    max_file_bytes: int,
    log_check: tuple[Verifier | None, Sequence[Verifier], int | None, str | None],
    fork_source: Path | None,
) -> PackVerdict:
    limits = ArchiveLimits(max_member_bytes=max_file_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(limits.max_total_bytes + 1)
        if len(data) > limits.max_total_bytes:
            raise PackArchiveError(f"pack archive is larger than {limits.max_total_bytes} bytes")
        archive = read_pack_archive(data, limits)
    except OSError as exc:
        return _verify(path, trusted_keys, now, max_file_bytes, log_check, failed=str(exc))
    except PackArchiveError as exc:
        return _verify(path, trusted_keys, now, max_file_bytes, log_check, failed=exc.message)
    with tempfile.TemporaryDirectory(prefix="affidavit-pack-verify-") as tmp:
        root = write_members(archive, Path(tmp))
        with collector_paused():
            return _verify(
                root, trusted_keys, now, max_file_bytes, log_check, fork_source=fork_source
            )


def _verify(
    path: Path,
    trusted_keys: Iterable[bytes | str] | None,
    now: datetime | None,
    max_file_bytes: int,
    log_check: tuple[Verifier | None, Sequence[Verifier], int | None, str | None] = (
        None,
        (),
        None,
        None,
    ),
    *,
    failed: str | None = None,
    fork_source: Path | None = None,
) -> PackVerdict:
    st = State(path, max_file_bytes=max_file_bytes)
    trusted = None if trusted_keys is None else {_raw_key(k) for k in trusted_keys}
    moment = now or datetime.now(UTC)
    details: dict[str, Any] = {
        "phase": 0,
        "errors": [],
        "warnings": st.warnings,
        "divergent_steps": [],
        "artifact_layout": {
            "episode_contract": F.CONTRACT,
            "inputs_dir": F.INPUTS_DIR,
            "recorded_traces_dir": F.TRACES_DIR,
            "events": F.EVENTS,
        },
    }

    def done(verdict: str, phase: int, parents: list[str], **kw: Any) -> PackVerdict:
        receipt = _receipt(st, verdict, parents=parents, **kw)
        problems = result_errors(receipt)
        if problems:  # never write a receipt that does not validate
            st.errors.extend(f"replay result: {p}" for p in problems)
            verdict, receipt = INTEGRITY_FAIL, _receipt(st, INTEGRITY_FAIL, parents=parents)
        details["phase"] = phase
        details["errors"] = list(st.errors)
        details["signer"] = _signer(st, trusted)
        return PackVerdict(verdict, EXIT_CODES[verdict], phase, list(st.errors), receipt, details)

    if failed is not None:  # the archive it came in is unreadable or refused
        st.errors.append(f"{st.root.name}: {failed}")
        return done(INTEGRITY_FAIL, 1, [])
    if not st.root.is_dir():
        st.errors.append(f"{st.root}: not a directory")
        return done(INTEGRITY_FAIL, 1, [])
    steps = check_contract(st)
    if st.errors:
        return done(INTEGRITY_FAIL, 1, [])
    check_integrity(st, trusted, moment)
    if st.errors:
        return done(INTEGRITY_FAIL, 2, [])
    by_id, traces = check_completeness(st, steps)
    parents: list[str] = []
    if st.close is not None:
        try:
            parents = [F.receipt_hash(st.close)]
        except (AffidavitError, RecursionError):
            st.errors.append(f"{F.CLOSE}: cannot be canonicalized")
    if st.errors:
        return done(INTEGRITY_FAIL, 3, parents)
    replayed, divergent = compare(steps, by_id, traces)
    details["divergent_steps"] = divergent
    details["affidavit"] = check_event_log(st, traces, trusted)
    if not st.errors and details["affidavit"].get("present"):
        _check_fork(st, details, fork_source, trusted)
    log_key, witness_keys, min_witnesses, log_url = log_check
    if log_key is not None:
        details["transparency_log"] = check_log_proof(
            st, log_key, witness_keys, min_witnesses, log_url
        )
    if st.errors:
        return done(INTEGRITY_FAIL, 5, parents)
    verdict = DIVERGE if divergent else MATCH
    return done(verdict, 4, parents, replayed=replayed, divergent=divergent)


def _check_fork(
    st: State,
    details: dict[str, Any],
    source: Path | None,
    trusted_keys: Iterable[bytes | str] | None,
) -> None:
    """A fork's ``details["fork"]`` (see :mod:`affidavit.packs._fork`); a prefix its source's
    pack does not hold is an error."""
    from affidavit.packs._fork import first_event, fork_details, forked_from

    try:
        forked = forked_from(first_event(st.root, st.max_file_bytes))
    except (OSError, ValueError) as exc:  # (read and verified just before: not expected)
        st.errors.append(f"{F.EVENTS}: {exc}")
        return
    if forked is None:
        return
    details["fork"], error = fork_details(
        forked,
        source,
        trusted_keys=trusted_keys,
        max_file_bytes=st.max_file_bytes,
    )
    if error is not None:
        st.errors.append(error)


def _raw_key(key: bytes | str) -> bytes:
    if isinstance(key, bytes):
        return key
    try:
        return base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _signer(st: State, trusted: set[bytes] | None) -> dict[str, Any]:
    manifest = st.manifest or {}
    pub = manifest.get("signer_pubkey")
    try:
        raw = base64.b64decode(pub, validate=True) if isinstance(pub, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    key_id = PublicKey.from_raw(raw).key_id if len(raw) == 32 else None
    if trusted is None:
        return {"key_id": key_id, "trust": "self-attested: the pack carries its own key"}
    return {"key_id": key_id, "trust": "trusted" if raw in trusted else "not trusted"}


def write_verdict(
    verdict: PackVerdict, out_dir: Path | str, *, pretty: bool = False
) -> tuple[Path, Path]:
    """Write ``rce_replay_result.json`` and ``rce_replay_details.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    indent = 2 if pretty else None
    receipt_path, details_path = out / F.RESULT_FILE, out / F.DETAILS_FILE
    receipt_path.write_text(json.dumps(verdict.receipt, indent=indent) + "\n", "utf-8")
    details_path.write_text(json.dumps(verdict.details, indent=indent, default=str) + "\n", "utf-8")
    return receipt_path, details_path
