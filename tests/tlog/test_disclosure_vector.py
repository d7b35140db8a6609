"""The committed vector of seal v2 and of a disclosure file (tests/vectors/disclosure_v1.json):
made again here from a fixed key and fixed events and compared byte for byte, and the committed
file verified as a verifier that has only it would.

Regenerate after a deliberate format change: ``python -m tests.tlog.test_disclosure_vector``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.seal import events_root, sign_seal
from affidavit.store import StoredEvent
from affidavit.tlog import build_disclosure, encode_disclosure, verify_disclosure

PATH = Path(__file__).parents[1] / "vectors" / "disclosure_v1.json"
SEED = bytes(range(32))
JOB_ID = "job-1"
SEALED_AT = "2026-01-01T00:00:00.000000Z"
# FORMATS §10's three events, then one step of two events
EVENTS: list[tuple[str, str, dict[str, Any]]] = [
    ("e1", "job_created", {"goal": "refund order 7"}),
    (
        "e2",
        "plan_generated",
        {"plan_hash": "7fddcbfd19b0125ad6eb73f67021d4fb654c6732226eaa18afee79f34ff4765e"},
    ),
    ("e3", "node_finished", {"node_id": "lookup", "result_type": "side_effect_committed"}),
    ("e4", "node_started", {"node_id": "refund", "step_id": "0011223344556677", "attempt": 1}),
    ("e5", "node_finished", {"node_id": "refund", "result_type": "pure", "output": {"ok": True}}),
]
SELECTOR = "refund"


def build_vector() -> dict[str, Any]:
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    head = GENESIS
    stored: list[StoredEvent] = []
    for version, (event_id, event_type, payload) in enumerate(EVENTS, start=1):
        data = canonical(payload)
        head = chain_next(head, event_id, event_type, data)
        stored.append(StoredEvent(JOB_ID, version, event_id, event_type, data, head.hex()))
    root = events_root([bytes.fromhex(e.chain_hash) for e in stored])
    seal = sign_seal(
        key,
        job_id=JOB_ID,
        event_count=len(stored),
        event_chain_root_hash=head.hex(),
        sealed_at=SEALED_AT,
        events_root=root,
    )
    document = build_disclosure(seal, stored, SELECTOR, None)
    return {
        "description": "seal v2 and an affidavit.disclosure/v1 file (docs/formats.md); the "
        "seal key is the Ed25519 key whose 32-byte seed is 00 01 02 ... 1f",
        "seal_public_key": base64.b64encode(
            key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        ).decode(),
        "events": [list(e) for e in EVENTS],
        "chain_hashes": [e.chain_hash for e in stored],
        "events_root": root,
        "seal_message": seal.message().decode(),
        "seal": seal.to_dict(),
        "selector": SELECTOR,
        "disclosure_file": encode_disclosure(document).decode(),
    }


def committed() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(PATH.read_text())
    return value


def test_the_vector_is_made_again_byte_for_byte() -> None:
    assert build_vector() == committed()


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 as written (recursive), independent of affidavit.core.merkle."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def test_the_committed_file_verifies_offline() -> None:
    vector = committed()
    assert vector["events_root"] == _mth([bytes.fromhex(h) for h in vector["chain_hashes"]]).hex()
    assert vector["seal"]["events_root"] == vector["events_root"]
    key = base64.b64decode(vector["seal_public_key"])
    result = verify_disclosure(vector["disclosure_file"].encode(), [key])
    assert result.ok, result.error
    assert [e["version"] for e in result.events] == [4, 5]
    document = json.loads(vector["disclosure_file"])
    text = vector["disclosure_file"]
    for event_id, _, payload in vector["events"][:3]:  # the undisclosed events
        assert f'"{event_id}"' not in text and canonical(payload).decode() not in text
    assert document["events"][0]["previous_chain_hash"] == vector["chain_hashes"][2]


if __name__ == "__main__":
    PATH.write_text(json.dumps(build_vector(), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {PATH}")
