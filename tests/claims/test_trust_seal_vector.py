"""The trust-log seal vector of docs/formats.md ("Trust-log seals"): a two-entry trust log, its
seal under record id ``trust:alice:2`` and its transparency-log leaf, recomputed here from the
spec's inputs, and verified (then cut short) by the verifier.

Regenerate ``tests/vectors/trust_seal_v1.json`` with
``python -m tests.claims.test_trust_seal_vector``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.merkle import leaf_hash
from affidavit.core.seal import PublicKey, log_leaf, seal_sha256, sign_seal
from affidavit.store import trust_record_id
from affidavit.verify import check_trust_log

VECTOR = Path(__file__).parents[1] / "vectors" / "trust_seal_v1.json"
SEED = bytes(range(32))  # the private key of the vector: never a real one
ENTRIES = [
    ("0190a1b2c3d4e5f60718293a4b5c6d7e", "agent_registered",
     {"agent_id": "alice", "at": "2026-01-01T00:00:00.000000Z", "namespace": "team",
      "role": "agent", "trust_score": 0.5}),
    ("0190a1b2c3d4e5f60718293a4b5c6d7f", "claim_verified",
     {"alpha": 0.1, "at": "2026-01-01T00:00:01.000000Z", "claim_id": None,
      "claim_type": "custom", "counted": True, "counted_verification_id": None,
      "counted_verdict": None, "decided_by": "default", "disagrees": False,
      "evidence_id": "0" * 64, "observation": 1.0,
      "pattern": {"new_trust_score": None, "pattern_id": None, "propagated": False,
                  "reason": "no pattern linked", "trust_delta": 0.0},
      "score_after": 0.55, "score_before": 0.5, "score_ewma": 0.55,
      "verdict": "accurate", "verification_id": "v-1", "verifier_id": "vera"}),
]  # fmt: skip
SEALED_AT = "2026-01-01T00:00:02.000000Z"


def build() -> dict[str, Any]:
    """The vector, computed from its inputs by the code under test."""
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    rows, previous = [], GENESIS
    for version, (entry_id, entry_type, payload) in enumerate(ENTRIES, start=1):
        body = canonical(payload)
        previous = chain_next(previous, entry_id, entry_type, body)
        rows.append(
            {
                "version": version,
                "entry_id": entry_id,
                "type": entry_type,
                "payload": body.decode(),
                "chain_hash": previous.hex(),
            }
        )
    seal = sign_seal(
        key,
        job_id=trust_record_id("alice", len(rows)),
        event_count=len(rows),
        event_chain_root_hash=previous.hex(),
        sealed_at=SEALED_AT,
    )
    leaf = log_leaf(seal)
    return {
        "_source": "docs/formats.md, Trust-log seals",
        "private_key_seed_hex": SEED.hex(),
        "public_key": PublicKey.from_raw(key.public_key().public_bytes_raw()).public_key_b64,
        "agent_id": "alice",
        "entries": rows,
        "seal": seal.to_dict(),
        "seal_message": seal.message().decode(),
        "seal_sha256": seal_sha256(seal),
        "leaf": leaf.decode(),
        "leaf_hash": leaf_hash(leaf).hex(),
    }


def test_the_vector_is_what_the_code_computes() -> None:
    assert json.loads(VECTOR.read_text()) == build()


def test_the_vector_verifies_and_a_cut_log_does_not() -> None:
    from affidavit.core.seal import Seal, unb64

    vector = json.loads(VECTOR.read_text())
    rows = [
        (e["version"], e["entry_id"], e["type"], e["payload"].encode(), e["chain_hash"])
        for e in vector["entries"]
    ]
    seal = Seal.from_dict(vector["seal"])
    keys = [PublicKey.from_raw(unb64(vector["public_key"]))]
    leaf = vector["leaf"].encode()
    logged = {seal.job_id: (leaf, False)}

    def leaf_of(record_id: str) -> tuple[bytes | None, bool]:
        return logged.get(record_id, (None, False))

    whole = check_trust_log("alice", rows, score=0.55, seal=seal, keys=keys, leaf_of=leaf_of)
    assert whole.ok, whole.problems
    cut = check_trust_log("alice", rows[:1], score=0.5, seal=seal, keys=keys, leaf_of=leaf_of)
    assert cut.problems == ["the trust log holds 1 entries, its seal covers 2: entry 2 was removed"]
    # the seal deleted too: the leaf the transparency log holds says the log was longer
    gone = check_trust_log("alice", rows[:1], score=0.5, seal=None, keys=keys, leaf_of=leaf_of)
    assert gone.problems == [
        "the trust log has no seal: nothing signed says how long it is",
        "the transparency log holds the seal of a trust log of 2 entries: this one was cut "
        "after entry 1",
    ]
    assert base64.b64decode(vector["public_key"]) == keys[0].public_key


if __name__ == "__main__":
    VECTOR.write_text(json.dumps(build(), indent=2, ensure_ascii=False) + "\n")
