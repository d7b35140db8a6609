"""Offline verification of a job's tlog-proof (``affidavit log verify``, packs, disclosures).

The contract, in order:

1. the proof parses (``c2sp.org/tlog-proof@v1``) and carries the seal's leaf in ``extra``;
2. the leaf is an ``affidavit.seal/v1`` leaf; when the caller knows the job's seal, the leaf is
   exactly that seal's leaf (a rewritten and re-sealed job fails here);
3. the checkpoint is signed by the log key (its name is the origin);
4. at least ``min_witnesses`` of the given witness keys cosigned it (each known cosignature
   must verify);
5. the inclusion proof binds the leaf's hash to the checkpoint's root;
6. the leaf is the first of its job in the checkpointed tree: proven for leaf 0, and, when the
   caller gives a source of the log's entries (``--log-url``, or the store), by reading every
   leaf before it and checking them against the checkpoint (:mod:`affidavit.tlog._entries`);
   otherwise not proven, and ``first_for_job`` is ``None`` with ``first_checked`` saying so.

It also reports the earliest verified witness cosignature over the checkpoints it is shown
that cover the leaf (:mod:`affidavit.tlog._cosigned`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.checkpoint import Checkpoint, TlogProof, verify_tlog_proof
from affidavit.core.errors import VerificationError
from affidavit.core.merkle import leaf_hash
from affidavit.core.note import Verifier
from affidavit.core.seal import LOG_LEAF_TYPE
from affidavit.tlog._cosigned import Cosigned, earliest_cosigned
from affidavit.tlog._entries import EntrySource, first_of_record

_LEAF_FIELDS = {"type", "job_id", "event_count", "event_chain_root_hash", "key_id", "seal_sha256"}


@dataclass
class ProofCheck:
    """The verdict on one tlog-proof; ``ok`` when ``errors`` is empty."""

    errors: list[str] = field(default_factory=list)
    leaf: dict[str, Any] | None = None
    index: int | None = None
    origin: str | None = None
    tree_size: int | None = None
    witnesses: list[str] = field(default_factory=list)
    # True: no earlier leaf of the tree has the job's id; False: one has; None: not proven
    first_for_job: bool | None = None
    first_checked: str = ""
    earliest_cosigned: Cosigned | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        cosigned = self.earliest_cosigned
        return {
            "ok": self.ok,
            "errors": self.errors,
            "leaf": self.leaf,
            "index": self.index,
            "origin": self.origin,
            "tree_size": self.tree_size,
            "witnesses": self.witnesses,
            "first_for_job": self.first_for_job,
            "first_checked": self.first_checked,
            "earliest_cosigned": cosigned.to_dict() if cosigned is not None else None,
        }


def parse_leaf(data: bytes) -> dict[str, Any]:
    """The fields of an ``affidavit.seal/v1`` leaf.

    Raises:
        VerificationError: not such a leaf.
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise VerificationError("the proof's leaf is not JSON") from None
    if not isinstance(value, dict) or set(value) != _LEAF_FIELDS:
        raise VerificationError("the proof's leaf is not an affidavit.seal/v1 leaf")
    if value["type"] != LOG_LEAF_TYPE:
        raise VerificationError(f"the proof's leaf has type {value['type']!r}")
    return value


def check_proof(
    text: str | bytes,
    log_key: Verifier,
    witnesses: Sequence[Verifier] = (),
    *,
    min_witnesses: int | None = None,
    expected_leaf: bytes | None = None,
    entries: EntrySource | None = None,
) -> ProofCheck:
    """Run the contract above; never raises for a bad proof (the errors say what failed).
    ``min_witnesses`` defaults to every given witness; ``entries`` is where the leaves before
    the proof's leaf are read from (step 6)."""
    result = ProofCheck()
    required = len(witnesses) if min_witnesses is None else min_witnesses
    try:
        proof = TlogProof.parse(text)  # (1)
        if proof.extra is None:
            raise VerificationError("the proof carries no leaf (no extra line)")
        result.index = proof.index
        result.leaf = parse_leaf(proof.extra)  # (2)
        if expected_leaf is not None and proof.extra != expected_leaf:
            raise VerificationError(
                "the logged leaf is not the job's seal: the job was re-sealed after it was "
                "logged, or the proof is another job's"
            )
        checkpoint, cosigned = verify_tlog_proof(  # (3), (4), (5)
            proof, leaf_hash(proof.extra), log_key, witnesses, min_witnesses=required
        )
        result.origin = checkpoint.origin
        result.tree_size = checkpoint.size
        result.witnesses = [w.name for w in cosigned]
        result.earliest_cosigned = earliest_cosigned(
            proof.index, [proof.checkpoint], log_key, witnesses
        )
        _check_first(result, checkpoint, proof.index, str(result.leaf["job_id"]), entries)
    except VerificationError as exc:
        result.errors.append(exc.message)
    return result


NOT_PROVEN = (
    "not proven: an inclusion proof alone cannot show that no earlier leaf of the tree is for "
    "the same job (give --log-url to read the {n} earlier leaves and check them against the "
    "checkpoint; witnesses that audit new entries cover the rest)"
)


def _check_first(
    result: ProofCheck,
    checkpoint: Checkpoint,
    index: int,
    job_id: str,
    entries: EntrySource | None,
) -> None:
    """Step 6.

    Raises:
        VerificationError: an earlier leaf of the tree is the job's, or the earlier leaves
            cannot be read or do not match the checkpoint.
    """
    if index == 0:
        result.first_for_job, result.first_checked = True, "leaf 0: no leaf before it"
        return
    if entries is None:
        result.first_checked = NOT_PROVEN.format(n=index)
        return
    earlier = first_of_record(entries, checkpoint, index, job_id)
    if earlier.index is not None:
        result.first_for_job = False
        result.first_checked = f"leaf {earlier.index} of the tree is the job's first"
        raise VerificationError(
            f"log_duplicate: leaf {index} is not the job's first leaf in the checkpointed tree "
            f"(leaf {earlier.index} is): the job was re-sealed after it was logged"
        )
    result.first_for_job = True
    result.first_checked = (
        f"the {earlier.read} leaves before it were read and match the checkpoint; none is the job's"
    )
