"""Names, constants and hash helpers shared by pack export and pack verification.

See docs/packs.md: every hash inside receipts and the episode contract is
``sha256:`` + hex(SHA-256(JCS(value))); hashes inside the manifest are bare hex.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib import resources
from typing import Any

from affidavit.core.canonical import canonical

MANIFEST = "pack_manifest.json"
SIGNATURE = "pack_signature.sig"
RECEIPTS = "receipt_pack.jsonl"
REPORT = "verify_report.json"
TRANSCRIPT = "verify_transcript.md"
CONTRACT = "episode_contract.json"
INPUTS_DIR = "inputs"
INPUT_REF = "input.json"
TRACES_DIR = "recorded_traces"
EVENTS = "events.ndjson"
UNSIGNED_DIR = "_unsigned"
KERNEL_FILES = (RECEIPTS, REPORT, TRANSCRIPT, MANIFEST, SIGNATURE)
HASHED_KERNEL_FILES = (RECEIPTS, REPORT, TRANSCRIPT)

OPEN = "rce.episode_open/v0"
STEP = "rce.episode_step/v0"
CLOSE = "rce.episode_close/v0"
REPLAY_RESULT = "rce.replay_result/v0"
EVENT_LOG = "affidavit.event_log/v0"
SEAL = "affidavit.seal/v0"
LEDGER = "affidavit.ledger/v0"

LOAD_STEP_ID = "load_input"
EMIT_STEP_ID = "emit_output"


def agent_pack_step_id(seq: int, step_id: str, steps: int) -> str:
    """The pack's step id of an agent job's step number ``seq`` (of ``steps`` recorded):
    ``seq`` zero-padded (to 6 digits, or as many as the last seq has), ``-`` and the step id.
    The steps depend on the input only, so the DAG order — ids sorted — is sequence order."""
    width = max(6, len(str(max(steps - 1, 0))))
    return f"{seq:0{width}d}-{step_id}"


# Top-level receipt keys left out of stored lines and receipt hashes (assay's v0 exclusion set).
RECEIPT_EXCLUDED = frozenset(
    {"signatures", "signature", "cose_signature", "receipt_hash", "anchor"}
)
# The manifest's signing base leaves these out.
MANIFEST_UNSIGNED = frozenset({"signature", "pack_root_sha256"})
SIGNATURE_SCOPE = "JCS(pack_manifest_excluding_signature_and_pack_root_sha256)"

VERIFIER_ID = "affidavit-rce-verify-py"
RESULT_FILE = "rce_replay_result.json"
DETAILS_FILE = "rce_replay_details.json"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prefixed(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def h(value: Any) -> str:
    """``sha256:`` + hex(SHA-256(JCS(value)))."""
    return prefixed(canonical(value))


def receipt_body(receipt: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in receipt.items() if k not in RECEIPT_EXCLUDED}


def receipt_hash(receipt: dict[str, Any]) -> str:
    return h(receipt_body(receipt))


def env_fingerprint_input(environment: Any) -> dict[str, Any]:
    if not isinstance(environment, dict):
        environment = {}
    return {
        "provider": environment.get("provider"),
        "model_id": environment.get("model_id"),
        "tool_versions": environment.get("tool_versions"),
        "container_digest": environment.get("container_digest"),
    }


def episode_spec_view(contract: dict[str, Any]) -> dict[str, Any]:
    return {
        "inputs": contract.get("inputs"),
        "replay_script": contract.get("replay_script"),
        "replay_policy": contract.get("replay_policy"),
        "environment": env_fingerprint_input(contract.get("environment")),
    }


def outputs_hash(step_payloads: list[dict[str, Any]]) -> str:
    """H of the ``{step_id, output_hash}`` of PASS ``EMIT_OUTPUT`` steps, sorted by step id."""
    outputs = [
        {"step_id": str(p.get("step_id")), "output_hash": p.get("output_hash")}
        for p in step_payloads
        if p.get("opcode") == "EMIT_OUTPUT" and p.get("step_status") == "PASS"
    ]
    outputs.sort(key=lambda item: str(item["step_id"]))
    return h(outputs)


def kahn_order(ids: list[str], deps: dict[str, list[str]]) -> list[str] | None:
    """Kahn's algorithm: zero-indegree ids sorted, children visited in sorted order. ``None``
    when there is a cycle. ``deps`` must only name known ids."""
    children: dict[str, list[str]] = {i: [] for i in ids}
    indegree = {i: 0 for i in ids}
    for i in ids:
        for d in deps.get(i, []):
            children[d].append(i)
            indegree[i] += 1
    from collections import deque

    queue = deque(sorted(i for i in ids if indegree[i] == 0))
    order: list[str] = []
    while queue:
        current = queue.popleft()
        order.append(current)
        kids = children[current]
        if len(kids) > 1:
            kids.sort()
        for child in kids:
            indegree[child] -= 1
            if indegree[child] == 0:
                queue.append(child)
    return order if len(order) == len(ids) else None


@cache
def schema(name: str) -> dict[str, Any]:
    """One of the JSON Schemas shipped in ``affidavit/packs/schemas``."""
    text = resources.files("affidavit.packs").joinpath("schemas", name).read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


SCHEMA_NAMES = (
    "attestation.schema.json",
    "pack_manifest.schema.json",
    "rce_episode_contract.schema.json",
    "rce_replay_result_v0.1.schema.json",
)
