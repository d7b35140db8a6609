"""``verify_pack``: phases 1–5 of PACK-FORMAT.md on a pack directory, offline.

Every check of a phase runs and every error is collected; the first phase with errors decides
the verdict. Nothing in a pack — missing files, bytes that are not UTF-8 or not JSON, values of
the wrong type, path escapes — makes this module raise: each is an ``INTEGRITY_FAIL`` with a
reason in ``errors``.
"""

from __future__ import annotations

import base64
import binascii
import json
import platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError
from affidavit.core.events import COMPLETED_RESULT_TYPES
from affidavit.core.seal import PublicKey
from affidavit.packs import _format as F
from affidavit.store import StoredEvent
from affidavit.verify import verify_events

MATCH, DIVERGE, INTEGRITY_FAIL = "MATCH", "DIVERGE", "INTEGRITY_FAIL"
EXIT_CODES = {MATCH: 0, DIVERGE: 1, INTEGRITY_FAIL: 2}
STATUSES = ("PASS", "FAIL", "SKIPPED")
FUTURE_SKEW = timedelta(hours=24)
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_EPISODE = re.compile(r"^ep_[0-9a-f]{24}$")
# assay's proof-pack receipt vocabulary: these flat legacy names, or a dotted namespaced type
_ALLOWED_FLAT = frozenset(
    {
        "ai_workflow",
        "capability_use",
        "challenge",
        "decision_v1",
        "governance_posture_snapshot",
        "grace_check",
        "guardian_check",
        "guardian_verdict",
        "mcp_tool_call",
        "model_call",
        "refusal",
        "revocation",
        "session_metadata",
        "supersession",
    }
)
_NAMESPACED = re.compile(r"^[a-z0-9_]+(?:\.[a-z0-9_]+)+(?:/[a-z0-9_]+)?$")


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


class _Fail(Exception):
    """A value is not what the pack format requires (caught per check)."""


@dataclass
class _State:
    root: Path
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    contract: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    receipts: list[Any] = field(default_factory=list)
    close: dict[str, Any] | None = None


# --- safe readers ----------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(data: bytes, what: str) -> Any:
    try:
        return orjson.loads(data)  # fast path; anything it refuses gets the exact reason below
    except orjson.JSONDecodeError:
        pass
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Fail(f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _Fail(f"{what}: invalid JSON ({str(exc)[:200]})") from None


def _safe_path(
    root: Path, rel: Any, what: str, *, plain: bool = False, within: Path | None = None
) -> Path:
    """``root/rel`` when ``rel`` is a relative path that stays inside ``root``. ``plain``: the
    caller checked that ``root`` is a real directory inside the pack (see :func:`_plain_dir`),
    so a single plain file name that is not a symlink needs no resolving."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise _Fail(f"{what}: {rel!r} is not a relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise _Fail(f"{what}: {rel!r} escapes the pack directory")
    path = root / rel
    if plain and _SIMPLE.match(rel) and not path.is_symlink():
        return path  # one plain name in a directory already checked: nothing to resolve
    try:
        path.resolve().relative_to((within or root).resolve())
    except (ValueError, OSError):
        raise _Fail(f"{what}: {rel!r} escapes the pack directory") from None
    return path


_SIMPLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def _plain_dir(root: Path, sub: str) -> bool:
    """``root/sub`` is a real directory (not a symlink) that resolves inside ``root``."""
    path = root / sub
    try:
        if path.is_dir() and not path.is_symlink():
            path.resolve().relative_to(root.resolve())
            return True
    except (ValueError, OSError):
        pass
    return False


def _read(path: Path, what: str) -> bytes:
    try:
        if not path.is_file():
            raise _Fail(f"{what}: missing")
        return path.read_bytes()
    except OSError as exc:
        raise _Fail(f"{what}: cannot be read ({exc.strerror})") from None


def _hash(value: Any, what: str) -> str:
    try:
        return F.h(value)
    except (AffidavitError, RecursionError) as exc:
        raise _Fail(f"{what}: cannot be canonicalized ({getattr(exc, 'message', exc)})") from None


def _hex(value: Any) -> str:
    try:
        return F.sha256_hex(canonical(value))
    except (AffidavitError, RecursionError) as exc:
        raise _Fail(f"cannot be canonicalized ({getattr(exc, 'message', exc)})") from None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _payload(receipt: dict[str, Any]) -> dict[str, Any]:
    inner = receipt.get("payload")
    return inner if isinstance(inner, dict) else receipt


def _rtype(receipt: Any) -> str:
    if not isinstance(receipt, dict):
        return ""
    value = receipt.get("type") or receipt.get("receipt_type") or ""
    return value if isinstance(value, str) else ""


# --- schemas --------------------------------------------------------------------------------


@cache
def _validator(name: str) -> Any:
    import jsonschema  # type: ignore[import-untyped]
    from referencing import Registry, Resource

    schema = F.schema(name)
    if name == "pack_manifest.schema.json":
        attestation = F.schema("attestation.schema.json")
        registry: Registry[Any] = Registry().with_resource(
            attestation["$id"], Resource.from_contents(attestation)
        )
        return jsonschema.Draft202012Validator(schema, registry=registry)
    if name == "attestation.schema.json":
        return jsonschema.Draft202012Validator(schema)
    return jsonschema.Draft7Validator(schema)


def _raw_schema_errors(name: str, value: Any) -> list[tuple[tuple[Any, ...], str]]:
    try:
        found = sorted(_validator(name).iter_errors(value), key=lambda e: list(map(str, e.path)))
    except RecursionError:
        return [((), "nested too deeply to validate")]
    return [(tuple(e.absolute_path), e.message[:300]) for e in found]


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "(root)"


def schema_errors(name: str, value: Any) -> list[str]:
    """Validation errors of ``value`` against one of the shipped schemas, as ``path: message``."""
    return [f"{_where(path)}: {message}" for path, message in _raw_schema_errors(name, value)]


def _step_shape(step: Any) -> Any:
    """``step`` with its step id and dependency names replaced by placeholders when they are
    strings (unique, for ``depends_on``): the schema constrains them only to be that, so two
    steps of one shape are valid or invalid together."""
    if not isinstance(step, dict):
        return step
    shape = dict(step)
    if isinstance(shape.get("step_id"), str):
        shape["step_id"] = "s"
    deps = shape.get("depends_on")
    if (
        isinstance(deps, list)
        and all(isinstance(d, str) for d in deps)
        and len(set(deps)) == len(deps)
    ):
        shape["depends_on"] = [f"d{i}" for i in range(len(deps))]
    return shape


def contract_schema_errors(contract: Any) -> list[str]:
    """:func:`schema_errors` for an episode contract, validating each distinct step shape once
    (a 10,000-step script has a handful) and reporting errors at every step of that shape."""
    name = F.SCHEMA_NAMES[2]
    script = contract.get("replay_script") if isinstance(contract, dict) else None
    steps = script.get("steps") if isinstance(script, dict) else None
    if not isinstance(script, dict) or not isinstance(steps, list) or len(steps) < 32:
        return schema_errors(name, contract)
    index: dict[str, int] = {}
    reps: list[Any] = []
    owners: list[list[int]] = []
    for i, step in enumerate(steps):
        shape = _step_shape(step)
        try:
            key = json.dumps(shape, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            key = f"#{i}"
        if key not in index:
            index[key] = len(reps)
            reps.append(shape)
            owners.append([])
        owners[index[key]].append(i)
    probe = {**contract, "replay_script": {**script, "steps": reps}}
    out: list[str] = []
    for path, message in _raw_schema_errors(name, probe):
        if len(path) >= 3 and path[:2] == ("replay_script", "steps") and type(path[2]) is int:
            for i in owners[path[2]]:
                out.append(f"{_where(('replay_script', 'steps', i, *path[3:]))}: {message}")
        else:
            out.append(f"{_where(path)}: {message}")
    return out


# --- phase 1: the episode contract --------------------------------------------------------------


def _phase1(st: _State) -> list[dict[str, Any]]:
    """Contract checks; the steps in DAG order (empty when the DAG is unusable)."""
    try:
        contract = _loads(_read(st.root / F.CONTRACT, F.CONTRACT), F.CONTRACT)
    except _Fail as exc:
        st.errors.append(str(exc))
        return []
    if not isinstance(contract, dict):
        st.errors.append(f"{F.CONTRACT}: not a JSON object")
        return []
    st.contract = contract
    st.errors.extend(f"{F.CONTRACT}: {e}" for e in contract_schema_errors(contract))
    environment = contract.get("environment")
    if isinstance(environment, dict):
        try:
            if environment.get("env_fingerprint_hash") != _hash(
                F.env_fingerprint_input(environment), "environment"
            ):
                st.errors.append(
                    f"{F.CONTRACT}: environment.env_fingerprint_hash does not match the "
                    "identity-bearing environment"
                )
        except _Fail as exc:
            st.errors.append(f"{F.CONTRACT}: {exc}")
    script = contract.get("replay_script")
    raw_steps = script.get("steps") if isinstance(script, dict) else None
    if not isinstance(raw_steps, list) or not raw_steps:
        st.errors.append(f"{F.CONTRACT}: replay_script.steps is missing or empty")
        return []
    steps: dict[str, dict[str, Any]] = {}
    for index, step in enumerate(raw_steps):
        sid = step.get("step_id") if isinstance(step, dict) else None
        if not isinstance(sid, str) or not sid:
            st.errors.append(f"{F.CONTRACT}: replay_script.steps[{index}] has no step_id")
        elif sid in steps:
            st.errors.append(f"{F.CONTRACT}: duplicate step_id {sid!r}")
        else:
            steps[sid] = step
    deps: dict[str, list[str]] = {}
    for sid, step in steps.items():
        declared = step.get("depends_on")
        if not isinstance(declared, list):
            st.errors.append(f"{F.CONTRACT}: step {sid!r}: depends_on is not a list")
            declared = []
        known = []
        for d in declared:
            if isinstance(d, str) and d in steps:
                known.append(d)
            else:
                st.errors.append(f"{F.CONTRACT}: step {sid!r} depends on unknown step {d!r}")
        deps[sid] = list(dict.fromkeys(known))
    parents = {d for ds in deps.values() for d in ds}
    if not any(steps[s].get("opcode") == "EMIT_OUTPUT" for s in steps if s not in parents):
        st.errors.append(f"{F.CONTRACT}: no terminal EMIT_OUTPUT step")
    order = F.kahn_order(list(steps), deps)
    if order is None:
        st.errors.append(f"{F.CONTRACT}: the step graph has a cycle")
        return []
    return [steps[s] for s in order]


# --- phase 2: pack integrity -------------------------------------------------------------------


def _phase2(st: _State, trusted: set[bytes] | None, now: datetime) -> None:
    try:
        manifest = _loads(_read(st.root / F.MANIFEST, F.MANIFEST), F.MANIFEST)
    except _Fail as exc:
        st.errors.append(str(exc))
        return
    if not isinstance(manifest, dict):
        st.errors.append(f"{F.MANIFEST}: not a JSON object")
        return
    st.manifest = manifest
    st.errors.extend(f"{F.MANIFEST}: {e}" for e in schema_errors(F.SCHEMA_NAMES[1], manifest))
    files = manifest.get("files")
    for entry in files if isinstance(files, list) else []:
        if not isinstance(entry, dict):
            continue
        rel = entry.get("path")
        try:
            data = _read(_safe_path(st.root, rel, f"{F.MANIFEST} files"), str(rel))
        except _Fail as exc:
            st.errors.append(str(exc))
            continue
        if F.sha256_hex(data) != entry.get("sha256"):
            st.errors.append(f"{rel}: sha256 does not match the manifest")
        if entry.get("bytes") != len(data):
            st.warnings.append(f"{rel}: size differs from the manifest")
    expected = manifest.get("expected_files")
    for name in expected if isinstance(expected, list) else []:
        try:
            if not _safe_path(st.root, name, f"{F.MANIFEST} expected_files").is_file():
                st.errors.append(f"{name}: expected file missing")
        except _Fail as exc:
            st.errors.append(str(exc))
    for name in F.KERNEL_FILES:
        if not (st.root / name).is_file() and not any(e.startswith(name) for e in st.errors):
            st.errors.append(f"{name}: missing")
    _receipts_check(st, manifest)
    attestation = manifest.get("attestation")
    try:
        if manifest.get("attestation_sha256") != _hex(attestation):
            st.errors.append(f"{F.MANIFEST}: attestation_sha256 does not match the attestation")
        if manifest.get("pack_root_sha256") != manifest.get("attestation_sha256"):
            st.errors.append(f"{F.MANIFEST}: pack_root_sha256 is not attestation_sha256")
    except _Fail as exc:
        st.errors.append(f"{F.MANIFEST}: attestation {exc}")
    _signature_check(st, manifest, trusted)
    if isinstance(attestation, dict):
        stamp = attestation.get("timestamp_end") or attestation.get("timestamp_start")
        when = _parse_time(stamp)
        if when is not None and when - now > FUTURE_SKEW:
            st.errors.append(f"{F.MANIFEST}: attestation timestamp {stamp} is in the future")


def _receipts_check(st: _State, manifest: dict[str, Any]) -> None:
    try:
        data = _read(st.root / F.RECEIPTS, F.RECEIPTS)
    except _Fail as exc:
        if not any(e.startswith(F.RECEIPTS) for e in st.errors):
            st.errors.append(str(exc))
        return
    lines = data.split(b"\n")
    receipts: list[Any] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            receipts.append(_loads(line, f"{F.RECEIPTS} line {number}"))
        except _Fail as exc:
            st.errors.append(str(exc))
            return
    st.receipts = receipts
    if manifest.get("receipt_count_expected") != len(receipts):
        st.errors.append(
            f"{F.RECEIPTS}: {len(receipts)} receipts, the manifest expects "
            f"{manifest.get('receipt_count_expected')!r}"
        )
    integrity_ok = True
    seen: set[str] = set()
    head: str | None = None
    for index, receipt in enumerate(receipts):
        if not isinstance(receipt, dict):
            st.errors.append(f"{F.RECEIPTS}: receipt {index} is not an object")
            integrity_ok = False
            head = None
            continue
        for name in ("receipt_id", "type", "timestamp"):
            if not receipt.get(name):
                integrity_ok = False
        if receipt.get("timestamp") is not None and _parse_time(receipt["timestamp"]) is None:
            integrity_ok = False
        rid = receipt.get("receipt_id")
        if isinstance(rid, str) and rid:
            if rid in seen:
                integrity_ok = False
            seen.add(rid)
        rtype = _rtype(receipt)
        if rtype and rtype not in _ALLOWED_FLAT and not _NAMESPACED.match(rtype):
            st.errors.append(f"{F.RECEIPTS}: receipt {index} has unsupported type {rtype!r}")
        if rtype.startswith("loom."):
            st.errors.append(f"{F.RECEIPTS}: receipt {index} has unsupported type {rtype!r}")
        if any(not isinstance(k, str) or not k.isascii() for k in receipt):
            integrity_ok = False
        try:
            head = _hex(F.receipt_body(receipt))
        except _Fail:
            integrity_ok = False
            head = None
    attestation = manifest.get("attestation")
    if not isinstance(attestation, dict):
        return
    claimed = attestation.get("receipt_integrity")
    if claimed and claimed != ("PASS" if integrity_ok else "FAIL"):
        st.errors.append(
            f"{F.RECEIPTS}: recomputed receipt integrity is "
            f"{'PASS' if integrity_ok else 'FAIL'}, the attestation claims {claimed!r}"
        )
    claimed_head = attestation.get("head_hash")
    if claimed_head:
        if not receipts:
            head = F.sha256_hex(b"empty")
        if head != claimed_head:
            st.errors.append(f"{F.RECEIPTS}: head hash does not match the attestation")


def _signature_check(st: _State, manifest: dict[str, Any], trusted: set[bytes] | None) -> None:
    signature_b64 = manifest.get("signature")
    try:
        if not isinstance(signature_b64, str) or not signature_b64:
            raise _Fail(f"{F.MANIFEST}: no signature")
        try:
            signature = base64.b64decode(signature_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _Fail(f"{F.MANIFEST}: signature is not base64") from None
        try:
            detached = _read(st.root / F.SIGNATURE, F.SIGNATURE)
        except _Fail as exc:
            st.errors.append(str(exc))
        else:
            if detached != signature:
                st.errors.append(f"{F.SIGNATURE}: does not match the manifest signature")
        pub_b64 = manifest.get("signer_pubkey")
        try:
            public = base64.b64decode(pub_b64 if isinstance(pub_b64, str) else "", validate=True)
        except (binascii.Error, ValueError):
            raise _Fail(f"{F.MANIFEST}: signer_pubkey is not base64") from None
        if len(public) != 32:
            raise _Fail(f"{F.MANIFEST}: signer_pubkey is not a 32-byte Ed25519 key")
        if manifest.get("signer_pubkey_sha256") != F.sha256_hex(public):
            raise _Fail(f"{F.MANIFEST}: signer_pubkey does not match signer_pubkey_sha256")
        unsigned = {k: v for k, v in manifest.items() if k not in F.MANIFEST_UNSIGNED}
        try:
            message = canonical(unsigned)
        except (AffidavitError, RecursionError):
            raise _Fail(f"{F.MANIFEST}: cannot be canonicalized") from None
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        except (InvalidSignature, ValueError):
            raise _Fail(f"{F.MANIFEST}: signature does not verify with signer_pubkey") from None
        if trusted is not None and public not in trusted:
            raise _Fail(
                f"{F.MANIFEST}: signer not trusted (key id {PublicKey.from_raw(public).key_id})"
            )
    except _Fail as exc:
        st.errors.append(str(exc))


# --- phase 3: completeness -------------------------------------------------------------------


def _phase3(st: _State, steps: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    contract = st.contract or {}
    receipts = [r for r in st.receipts if isinstance(r, dict)]
    opens = [r for r in receipts if _rtype(r) == F.OPEN]
    closes = [r for r in receipts if _rtype(r) == F.CLOSE]
    if len(opens) != 1:
        st.errors.append(f"{F.RECEIPTS}: {len(opens)} {F.OPEN} receipts, expected one")
    if len(closes) != 1:
        st.errors.append(f"{F.RECEIPTS}: {len(closes)} {F.CLOSE} receipts, expected one")
    st.close = closes[0] if closes else None
    known = {s["step_id"] for s in steps}
    by_id: dict[str, dict[str, Any]] = {}
    for r in receipts:
        if _rtype(r) != F.STEP:
            continue
        p = _payload(r)
        sid = p.get("step_id")
        if not isinstance(sid, str) or not sid:
            st.errors.append(f"{F.RECEIPTS}: a step receipt has no step_id")
        elif sid not in known:
            st.errors.append(f"{F.RECEIPTS}: step receipt for unknown step {sid!r}")
        elif sid in by_id:
            st.errors.append(f"{F.RECEIPTS}: duplicate step receipt for {sid!r}")
        else:
            by_id[sid] = p
    for sid in sorted(known - set(by_id)):
        st.errors.append(f"{F.RECEIPTS}: no step receipt for step {sid!r}")
    episode_id = contract.get("episode_id")
    # inputs
    inputs = contract.get("inputs")
    for item in inputs if isinstance(inputs, list) else []:
        ref = item.get("ref") if isinstance(item, dict) else None
        try:
            data = _read(
                _safe_path(st.root / F.INPUTS_DIR, ref, "input", within=st.root), f"inputs/{ref}"
            )
        except _Fail as exc:
            st.errors.append(str(exc))
            continue
        if isinstance(item, dict) and item.get("hash") != F.prefixed(data):
            st.errors.append(f"inputs/{ref}: bytes do not match the contract's hash")
    computed: dict[str, str | None] = {}
    for name, value in (
        ("episode_spec_hash", F.episode_spec_view(contract)),
        ("inputs_hash", contract.get("inputs")),
        ("script_hash", contract.get("replay_script")),
    ):
        try:
            computed[name] = _hash(value, name)
        except _Fail as exc:
            st.errors.append(f"{F.CONTRACT}: {exc}")
            computed[name] = None
    environment = contract.get("environment")
    computed["env_fingerprint_hash"] = (
        environment.get("env_fingerprint_hash") if isinstance(environment, dict) else None
    )
    if opens:
        o = _payload(opens[0])
        if o.get("episode_id") != episode_id:
            st.errors.append(f"{F.OPEN}: episode_id does not match {F.CONTRACT}")
        for name in ("episode_spec_hash", "env_fingerprint_hash", "inputs_hash", "script_hash"):
            if o.get(name) != computed[name]:
                st.errors.append(f"{F.OPEN}: {name} does not match {F.CONTRACT}")
        if o.get("replay_basis") != "recorded_trace" or o.get("comparator_tier") != "A":
            st.errors.append(f"{F.OPEN}: replay_basis/comparator_tier must be recorded_trace/A")
        if _int(o.get("n_steps")) != len(steps):
            st.errors.append(f"{F.OPEN}: n_steps does not match the replay script in {F.CONTRACT}")
    policy = contract.get("replay_policy")
    policy = policy if isinstance(policy, dict) else {}
    overrides = policy.get("comparator_tiers_by_step")
    overrides = overrides if isinstance(overrides, dict) else {}
    traces: dict[str, str] = {}  # step id -> H(recorded trace)
    plain_traces = _plain_dir(st.root, F.TRACES_DIR)
    status: dict[str, str] = {}
    for step in steps:
        sid = step["step_id"]
        if sid not in by_id:
            continue
        p = by_id[sid]
        where = f"{F.STEP}[{sid}]"
        if p.get("episode_id") != episode_id:
            st.errors.append(f"{where}: episode_id does not match {F.CONTRACT}")
        if p.get("opcode") != step.get("opcode"):
            st.errors.append(f"{where}: opcode does not match the replay script in {F.CONTRACT}")
        if p.get("comparator_tier") != (overrides.get(sid) or policy.get("comparator_tier")):
            st.errors.append(f"{where}: comparator_tier does not match the replay policy")
        s = p.get("step_status")
        if s not in STATUSES:
            st.errors.append(f"{where}: invalid step_status {s!r}")
            continue
        status[sid] = s
        deps = [d for d in step.get("depends_on") or [] if isinstance(d, str)]
        blocked = any(status.get(d) in ("FAIL", "SKIPPED") for d in deps)
        if blocked and s != "SKIPPED":
            st.errors.append(f"{where}: a step after a FAIL or SKIPPED dependency must be SKIPPED")
        if not blocked and s == "SKIPPED":
            st.errors.append(f"{where}: SKIPPED without a FAIL or SKIPPED dependency")
        if s == "SKIPPED":
            if p.get("output_hash") is not None or p.get("input_hashes") != []:
                st.errors.append(f"{where}: SKIPPED needs output_hash null and input_hashes []")
            if p.get("output_size_bytes") != 0 or p.get("duration_ms") != 0:
                st.errors.append(f"{where}: SKIPPED needs output_size_bytes and duration_ms 0")
            continue
        if not isinstance(p.get("output_hash"), str) or not _HASH.match(p["output_hash"]):
            st.errors.append(f"{where}: output_hash is not sha256:<64 hex>")
        expected_chain = [by_id[d].get("output_hash") if d in by_id else None for d in deps]
        if p.get("input_hashes") != expected_chain:
            st.errors.append(
                f"{where}: input_hashes do not match the dependencies' output hashes "
                "(chain integrity)"
            )
        try:
            path = _safe_path(
                st.root / F.TRACES_DIR,
                f"{sid}.json",
                "recorded trace",
                plain=plain_traces,
                within=st.root,
            )
            data = _read(path, f"{F.TRACES_DIR}/{sid}.json")
            value = _loads(data, f"{F.TRACES_DIR}/{sid}.json")
        except _Fail as exc:
            st.errors.append(str(exc))
            continue
        try:
            traces[sid] = F.h(value)
        except (AffidavitError, RecursionError):
            # not JCS-representable here (e.g. an integer beyond 2^53): hash the raw bytes,
            # which then cannot match a canonical output hash
            traces[sid] = F.prefixed(data)
    payloads = [by_id[s["step_id"]] for s in steps if s["step_id"] in by_id]
    if closes:
        c = _payload(closes[0])
        if c.get("episode_id") != episode_id:
            st.errors.append(f"{F.CLOSE}: episode_id does not match {F.CONTRACT}")
        if c.get("episode_spec_hash") != computed["episode_spec_hash"]:
            st.errors.append(f"{F.CLOSE}: episode_spec_hash does not match {F.CONTRACT}")
        try:
            if c.get("outputs_hash") != F.outputs_hash(payloads):
                st.errors.append(f"{F.CLOSE}: outputs_hash does not match the step receipts")
        except (AffidavitError, RecursionError):
            st.errors.append(f"{F.CLOSE}: outputs_hash cannot be recomputed")
        passed = sum(1 for p in payloads if p.get("step_status") == "PASS")
        executed = sum(1 for p in payloads if p.get("step_status") in ("PASS", "FAIL"))
        if _int(c.get("n_steps_executed")) != executed:
            st.errors.append(f"{F.CLOSE}: n_steps_executed does not match the step receipts")
        if _int(c.get("n_steps_passed")) != passed:
            st.errors.append(f"{F.CLOSE}: n_steps_passed does not match the step receipts")
        if c.get("all_steps_passed") is not (passed == len(steps)):
            st.errors.append(f"{F.CLOSE}: all_steps_passed does not match the step receipts")
        if c.get("replay_basis") != "recorded_trace" or c.get("comparator_tier") != "A":
            st.errors.append(f"{F.CLOSE}: replay_basis/comparator_tier must be recorded_trace/A")
    return by_id, traces


# --- phase 4: comparison -----------------------------------------------------------------------


def _phase4(
    steps: list[dict[str, Any]], by_id: dict[str, Any], traces: dict[str, str]
) -> tuple[int, list[dict[str, Any]]]:
    replayed = 0
    divergent: list[dict[str, Any]] = []
    for step in steps:
        sid = step["step_id"]
        p = by_id[sid]
        if p.get("step_status") == "SKIPPED":
            continue
        replayed += 1
        observed = traces[sid]
        if observed != p.get("output_hash"):
            divergent.append(
                {
                    "step_id": sid,
                    "expected_output_hash": p.get("output_hash"),
                    "observed_output_hash": observed,
                    "comparator_tier": "A",
                    "comparator_detail": "JCS output hash mismatch",
                }
            )
    return replayed, divergent


# --- phase 5: affidavit's own receipts -------------------------------------------------------


def _phase5(st: _State, traces: dict[str, str]) -> dict[str, Any]:
    ours = [r for r in st.receipts if isinstance(r, dict) and _rtype(r).startswith("affidavit.")]
    if not ours:
        return {"present": False}
    found: dict[str, list[dict[str, Any]]] = {F.EVENT_LOG: [], F.SEAL: [], F.LEDGER: []}
    for r in ours:
        if _rtype(r) in found:
            found[_rtype(r)].append(r)
        else:
            st.errors.append(f"{F.RECEIPTS}: unknown affidavit receipt type {_rtype(r)!r}")
    for name, items in found.items():
        if len(items) != 1:
            st.errors.append(f"{F.RECEIPTS}: {len(items)} {name} receipts, expected one")
    if st.errors:
        return {"present": True}
    log, seal_r, ledger_r = (found[n][0] for n in (F.EVENT_LOG, F.SEAL, F.LEDGER))
    opened = [r for r in st.receipts if isinstance(r, dict) and _rtype(r) == F.OPEN]
    if opened and opened[0].get("objective") != (st.contract or {}).get("objective"):
        # descriptive for RCE, but an affidavit pack binds it like everything else
        st.errors.append(f"{F.CONTRACT}: objective differs from the {F.OPEN} receipt")
    try:
        data = _read(st.root / F.EVENTS, F.EVENTS)
    except _Fail as exc:
        st.errors.append(str(exc))
        return {"present": True}
    if log.get("events_sha256") != F.prefixed(data):
        st.errors.append(f"{F.EVENTS}: sha256 does not match the {F.EVENT_LOG} receipt")
    events: list[Any] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            try:
                events.append(_loads(line, f"{F.EVENTS} line {number}"))
            except _Fail as exc:
                st.errors.append(str(exc))
                return {"present": True}
    rows = ledger_r.get("rows")
    digests: list[tuple[str, str, str, str | None]] = []
    for row in rows if isinstance(rows, list) else [None]:
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) for k in ("idempotency_key", "status", "invocation_id")
        ):
            st.errors.append(f"{F.LEDGER}: malformed ledger row")
            continue
        result_hash = row.get("result_hash")
        digests.append(
            (
                row["idempotency_key"],
                row["status"],
                row["invocation_id"],
                result_hash if isinstance(result_hash, str) else None,
            )
        )
    seal = seal_r.get("seal")
    public = seal_r.get("public_key")
    job_id = st.receipts[0].get("run_id") if isinstance(st.receipts[0], dict) else None
    status = log.get("job_status")
    stored: list[StoredEvent] = []
    for position, e in enumerate(events, start=1):
        try:
            stored.append(
                StoredEvent(
                    str(job_id),
                    e["version"],
                    e["event_id"],
                    e["type"],
                    canonical(e["payload"]),
                    e["chain_hash"],
                )
            )
        except (AffidavitError, KeyError, TypeError, RecursionError) as exc:
            st.errors.append(f"{F.EVENTS}: event {position} is malformed ({exc})")
            return {"present": True}
        if e.get("job_id") != job_id or type(e["version"]) is not int:
            st.errors.append(f"{F.EVENTS}: event {position} is malformed")
            return {"present": True}
        if not all(isinstance(e[k], str) for k in ("event_id", "type", "chain_hash")):
            st.errors.append(f"{F.EVENTS}: event {position} is malformed")
            return {"present": True}
    try:
        result = verify_events(
            stored,
            public_keys=[public] if isinstance(public, str) else [],
            seal=seal if isinstance(seal, dict) else None,
            ledger_digests=digests,
            status=status if isinstance(status, str) else None,
            job_id=job_id if isinstance(job_id, str) else None,
        )
    except AffidavitError as exc:
        st.errors.append(f"{F.EVENTS}: {exc.message}")
        return {"present": True}
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        st.errors.append(f"{F.EVENTS}: malformed ({type(exc).__name__}: {str(exc)[:200]})")
        return {"present": True}
    for check in result.checks():
        if not check.ok:
            st.errors.append(f"{F.EVENTS}: {check.name}: {check.detail}")
    for name, value in (
        ("event_count", result.stored_chain.event_count),
        ("event_chain_root_hash", result.event_chain_root_hash),
        ("execution_hash", result.execution_hash),
    ):
        if log.get(name) != value:
            st.errors.append(f"{F.EVENT_LOG}: {name} does not match {F.EVENTS}")
    if result.ok:
        _bind_traces(st, events, traces)
    return {"present": True, "job_verification": result.to_dict()}


def _bind_traces(st: _State, events: list[dict[str, Any]], traces: dict[str, str]) -> None:
    """The recorded traces and the input file against the (verified) event log: a trace
    rewritten after export is an integrity failure here, not a divergence. One pass over the
    parsed events; the log's replay invariants were checked by ``verify_events`` already."""
    job_input: Any = None
    status, output, error = "pending", None, None
    step_of: dict[str, str] = {}
    finished: dict[str, dict[str, Any]] = {}
    succeeded: dict[str, Any] = {}
    committed: dict[str, Any] = {}
    try:
        for e in events:
            kind, p = e["type"], e["payload"]
            if kind == "node_started":
                step_of[p["node_id"]] = p["step_id"]
            elif kind == "node_finished":
                step_of[p["node_id"]] = p["step_id"]
                finished[p["node_id"]] = p
            elif kind == "tool_invocation_finished" and p.get("outcome") == "success":
                succeeded[p["idempotency_key"]] = p.get("result")
            elif kind == "command_committed":
                committed.setdefault(p["node_id"], succeeded.get(p["idempotency_key"]))
            elif kind == "job_created":
                job_input = p.get("input")
            elif kind == "job_completed":
                status, output = "completed", p.get("output")
            elif kind == "job_failed":
                status, error = "failed", p.get("error")
            elif kind == "job_cancelled":
                status = "cancelled"
    except (KeyError, TypeError, AttributeError) as exc:
        st.errors.append(f"{F.EVENTS}: cannot be replayed ({type(exc).__name__}: {exc})")
        return
    try:
        data = _read(st.root / F.INPUTS_DIR / F.INPUT_REF, f"{F.INPUTS_DIR}/{F.INPUT_REF}")
        if data != canonical(job_input):
            st.errors.append(f"{F.INPUTS_DIR}/{F.INPUT_REF}: differs from the job's input")
    except (_Fail, AffidavitError) as exc:
        st.errors.append(f"{F.INPUTS_DIR}/{F.INPUT_REF}: {exc}")
    expected: dict[str, list[Any]] = {
        F.LOAD_STEP_ID: [job_input],
        F.EMIT_STEP_ID: [
            {"claim_type": "job_output", "output": output}
            if status == "completed"
            else {"claim_type": "job_output", "status": status, "error": error}
        ],
    }
    for node_id, sid in step_of.items():
        done = finished.get(node_id)
        if done is None:  # started, never finished
            expected[sid] = [{"outcome": None, "error": None}]
        elif done.get("result_type") in COMPLETED_RESULT_TYPES:
            expected[sid] = [done["output"] if "output" in done else committed.get(node_id)]
        else:
            expected[sid] = [{"outcome": done.get("result_type"), "error": done.get("error")}]
    not_run = {"outcome": "not_run", "job_status": status}
    for sid, observed in traces.items():
        try:
            same = any(observed == F.h(value) for value in expected.get(sid, [not_run]))
        except (AffidavitError, RecursionError):
            same = False
        if not same:
            st.errors.append(f"{F.TRACES_DIR}/{sid}.json: differs from the event log")


# --- the verdict -------------------------------------------------------------------------------


def _version() -> str:
    try:
        return metadata.version("affidavit")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _receipt(
    st: _State,
    verdict: str,
    *,
    parents: list[str],
    replayed: int = 0,
    divergent: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    contract = st.contract or {}
    episode_id = contract.get("episode_id")
    root = (st.manifest or {}).get("pack_root_sha256")

    def safe(value: Any) -> str:
        try:
            return F.h(value)
        except (AffidavitError, RecursionError):
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
        if isinstance(episode_id, str) and _EPISODE.match(episode_id)
        else "ep_" + "0" * 24,
        "episode_spec_hash": safe(F.episode_spec_view(contract)),
        "original_pack_root_sha256": "sha256:"
        + (root if isinstance(root, str) and _HEX64.match(root) else "0" * 64),
        "verdict": verdict,
        "receipt_integrity": "FAIL" if verdict == INTEGRITY_FAIL else "PASS",
        "claim_check": None
        if verdict == INTEGRITY_FAIL
        else ("PASS" if verdict == MATCH else "FAIL"),
        "replay_basis": "recorded_trace",
        "comparator_tier": "A",
        "script_hash": safe(contract.get("replay_script")),
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
) -> PackVerdict:
    """Verify the pack directory at ``path`` (phases 1–5 of PACK-FORMAT.md). Never raises on a
    malformed pack.

    ``trusted_keys`` (raw 32-byte Ed25519 public keys or their base64) pins the accepted
    signers; without it the pack is self-attested and the details name the signer's key id.
    """
    st = _State(Path(path))
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

    if not st.root.is_dir():
        st.errors.append(f"{st.root}: not a directory")
        return done(INTEGRITY_FAIL, 1, [])
    steps = _phase1(st)
    if st.errors:
        return done(INTEGRITY_FAIL, 1, [])
    _phase2(st, trusted, moment)
    if st.errors:
        return done(INTEGRITY_FAIL, 2, [])
    by_id, traces = _phase3(st, steps)
    parents: list[str] = []
    if st.close is not None:
        try:
            parents = [F.receipt_hash(st.close)]
        except (AffidavitError, RecursionError):
            st.errors.append(f"{F.CLOSE}: cannot be canonicalized")
    if st.errors:
        return done(INTEGRITY_FAIL, 3, parents)
    replayed, divergent = _phase4(steps, by_id, traces)
    details["divergent_steps"] = divergent
    details["affidavit"] = _phase5(st, traces)
    if st.errors:
        return done(INTEGRITY_FAIL, 5, parents)
    verdict = DIVERGE if divergent else MATCH
    return done(verdict, 4, parents, replayed=replayed, divergent=divergent)


def _raw_key(key: bytes | str) -> bytes:
    if isinstance(key, bytes):
        return key
    try:
        return base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _signer(st: _State, trusted: set[bytes] | None) -> dict[str, Any]:
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
