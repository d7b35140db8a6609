"""RFC 6962 / 9162 Merkle trees: transparency-dev's vectors and property tests."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.merkle import (
    EMPTY_ROOT,
    MemoryTree,
    ProofError,
    leaf_hash,
    node_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)
from tests.conftest import examples

VECTORS = Path(__file__).parent.parent / "vectors" / "merkle"


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value or "")


def _proof(data: dict[str, Any]) -> list[bytes]:
    return [_b64(p) for p in data.get("proof") or []]


def _cases(kind: str) -> list[Path]:
    return sorted((VECTORS / kind).rglob("*.json"))


def test_vectors_are_there() -> None:
    assert len(_cases("inclusion")) > 60
    assert len(_cases("consistency")) > 60


@pytest.mark.parametrize("path", _cases("inclusion"), ids=lambda p: str(p.relative_to(VECTORS)))
def test_inclusion_vector(path: Path) -> None:
    d = json.loads(path.read_text())
    args = (_b64(d["leafHash"]), d["leafIdx"], d["treeSize"], _proof(d), _b64(d["root"]))
    if d["wantErr"]:
        with pytest.raises(ProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", _cases("consistency"), ids=lambda p: str(p.relative_to(VECTORS)))
def test_consistency_vector(path: Path) -> None:
    d = json.loads(path.read_text())
    args = (d["size1"], d["size2"], _proof(d), _b64(d["root1"]), _b64(d["root2"]))
    if d["wantErr"]:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


# The RFC 6962 reference leaves that the vectors' trees are built from.
RFC_LEAVES = [
    bytes.fromhex(x)
    for x in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]


def _reference_root(leaves: list[bytes]) -> bytes:
    """MTH by the RFC's recursive definition, independent of the tree code."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


def test_generated_proofs_equal_the_vectors() -> None:
    tree = MemoryTree()
    tree.append(RFC_LEAVES)
    happy = json.loads((VECTORS / "inclusion" / "1" / "happy-path.json").read_text())
    assert tree.root(happy["treeSize"]) == _b64(happy["root"])
    assert tree.inclusion_proof(happy["leafIdx"], happy["treeSize"]) == _proof(happy)
    for n in range(5):
        path = VECTORS / "consistency" / str(n) / "happy-path.json"
        d = json.loads(path.read_text())
        assert tree.root(d["size1"]) == _b64(d["root1"])
        assert tree.consistency_proof(d["size1"], d["size2"]) == _proof(d)


def test_empty_tree_root() -> None:
    assert MemoryTree().root() == hashlib.sha256(b"").digest()
    with pytest.raises(ValueError):
        MemoryTree().inclusion_proof(0)


@settings(max_examples=examples(10, 200), deadline=None)
@given(st.integers(1, 20_000), st.data())
def test_every_proof_verifies_and_no_wrong_one_does(size: int, data: st.DataObject) -> None:
    tree = MemoryTree()
    leaves = [i.to_bytes(4, "big") for i in range(size)]
    # appended in random batches: the incremental node computation must equal one tree
    done = 0
    while done < size:
        step = data.draw(st.integers(1, max(1, size - done)))
        tree.append(leaves[done : done + step])
        done += step
    root = tree.root()
    if size <= 64:
        assert root == _reference_root(leaves)
    index = data.draw(st.integers(0, size - 1))
    proof = tree.inclusion_proof(index)
    verify_inclusion(leaf_hash(leaves[index]), index, size, proof, root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(b"not a leaf"), index, size, proof, root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(leaves[index]), index, size, proof, leaf_hash(b"x"))
    if size > 1:
        other = (index + 1) % size
        with pytest.raises(ProofError):
            verify_inclusion(leaf_hash(leaves[index]), other, size, proof, root)

    old = data.draw(st.integers(1, size))
    cproof = tree.consistency_proof(old)
    old_root = tree.root(old)
    verify_consistency(old, size, cproof, old_root, root)
    with pytest.raises(ProofError):
        verify_consistency(old, size, cproof, leaf_hash(b"x"), root)
    with pytest.raises(ProofError):
        verify_consistency(old, size, cproof, old_root, leaf_hash(b"x"))
    if cproof:
        with pytest.raises(ProofError):
            verify_consistency(old, size, cproof[:-1], old_root, root)


def test_reference_roots_small_trees() -> None:
    for n in range(0, 70):
        leaves = [bytes([i]) for i in range(n)]
        tree = MemoryTree()
        tree.append(leaves)
        assert tree.root() == _reference_root(leaves)
        for i in range(n):
            verify_inclusion(leaf_hash(leaves[i]), i, n, tree.inclusion_proof(i), tree.root())
        for m in range(1, n + 1):
            verify_consistency(m, n, tree.consistency_proof(m), tree.root(m), tree.root())


def test_root_of_equals_the_stored_tree_at_every_size() -> None:
    leaves = [i.to_bytes(4, "big") for i in range(300)]
    tree = MemoryTree()
    for n in range(0, 300):
        assert root_of(leaves[:n]) == tree.root(), n
        tree.append([leaves[n]])
