"""RFC 6962 / RFC 9162 Merkle trees over SHA-256: hashing, roots, inclusion and consistency
proofs (generation and verification).

    leaf hash = SHA-256(0x00 || leaf bytes)
    node hash = SHA-256(0x01 || left || right)
    MTH({})   = SHA-256("")

A tree's hashes are addressed as *perfect nodes* ``(level, index)``: the hash of the
``2**level`` leaves starting at ``index * 2**level``. Such a node never changes once its last
leaf exists, so a store keeps exactly these, and every proof is a fold over a few of them
(:func:`range_nodes`). Proof generation is split into *which* nodes a proof needs (pure, for one
batched read) and the fold (:func:`inclusion_proof`, :func:`consistency_proof`, given a lookup).

Verification follows RFC 9162 §2.1.3.2 and §2.1.4.2 and rejects every hash that is not 32 bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from affidavit.core.errors import VerificationError

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()

Node = tuple[int, int]  # (level, index)
Range = tuple[int, int]  # [start, end) of leaf indices


class ProofError(VerificationError, ValueError):
    """A proof does not verify (or its arguments cannot describe one); the message says why."""

    code = "proof_invalid"


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def root_of(leaves: Sequence[bytes]) -> bytes:
    """``MTH`` of ``leaves`` (leaf bytes), computed level by level: adjacent pairs are hashed
    and an unpaired last node rises unchanged, which builds RFC 6962's left-balanced tree."""
    if not leaves:
        return EMPTY_ROOT
    level = [leaf_hash(x) for x in leaves]
    while len(level) > 1:
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) & 1:
            paired.append(level[-1])
        level = paired
    return level[0]


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_nodes(start: int, end: int) -> list[Node]:
    """The perfect nodes covering leaves ``[start, end)``, left to right, largest first.

    For every range that appears in an RFC 6962 proof (``start`` aligned to a power of two at
    least ``end - start``), ``MTH(D[start:end])`` is the right fold of these nodes' hashes:
    ``h(n0, h(n1, ... h(n_{k-2}, n_{k-1})))``.
    """
    if not 0 <= start < end:
        raise ValueError(f"empty or negative range [{start}, {end})")
    nodes: list[Node] = []
    while start < end:
        level = (start & -start).bit_length() - 1 if start else (end - start).bit_length()
        while (1 << level) > end - start:
            level -= 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """Right fold of node hashes (see :func:`range_nodes`)."""
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = node_hash(h, acc)
    return acc


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The subtrees whose hashes form the inclusion proof of leaf ``index`` in a tree of
    ``size`` leaves, in proof order (the leaf's sibling first): RFC 9162 §2.1.3.1."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of size {size}")
    path: list[Range] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index - start < k:
            path.append((start + k, end))
            end = start + k
        else:
            path.append((start, start + k))
            start += k
    path.reverse()
    return path


def consistency_ranges(old_size: int, new_size: int) -> list[Range]:
    """The subtrees whose hashes form the consistency proof from ``old_size`` to ``new_size``,
    in proof order: RFC 9162 §2.1.4.1 (empty when the sizes are equal)."""
    if not 0 < old_size <= new_size:
        raise ValueError(f"no consistency proof from size {old_size} to size {new_size}")
    out: list[Range] = []
    start, end, m, whole = 0, new_size, old_size, True
    while True:
        if m == end - start:
            if not whole:
                out.append((start, end))
            break
        k = _split(end - start)
        if m <= k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start += k
            m -= k
            whole = False
    out.reverse()
    return out


def nodes_for(ranges: Iterable[Range]) -> set[Node]:
    """Every perfect node that the hashes of ``ranges`` fold from (one batched read)."""
    needed: set[Node] = set()
    for start, end in ranges:
        needed.update(range_nodes(start, end))
    return needed


def hash_ranges(ranges: Sequence[Range], lookup: Mapping[Node, bytes]) -> list[bytes]:
    """``MTH`` of each range from perfect-node hashes.

    Raises:
        KeyError: ``lookup`` lacks a node (the tree is not stored that far).
    """
    return [fold([lookup[n] for n in range_nodes(s, e)]) for s, e in ranges]


def root_nodes(size: int) -> list[Node]:
    return range_nodes(0, size) if size else []


def root_from(size: int, lookup: Mapping[Node, bytes]) -> bytes:
    """The root of the tree of ``size`` leaves from its perfect nodes."""
    return fold([lookup[n] for n in root_nodes(size)]) if size else EMPTY_ROOT


def inclusion_proof(
    index: int, size: int, get: Callable[[set[Node]], Mapping[Node, bytes]]
) -> list[bytes]:
    """The inclusion proof of leaf ``index`` in the tree of ``size``; ``get`` returns the hashes
    of the nodes asked for (one call)."""
    ranges = inclusion_ranges(index, size)
    return hash_ranges(ranges, get(nodes_for(ranges)))


def consistency_proof(
    old_size: int, new_size: int, get: Callable[[set[Node]], Mapping[Node, bytes]]
) -> list[bytes]:
    """The consistency proof between two tree sizes; ``get`` as for :func:`inclusion_proof`."""
    ranges = consistency_ranges(old_size, new_size)
    return hash_ranges(ranges, get(nodes_for(ranges)))


def new_nodes(
    old_size: int, leaf_hashes: Sequence[bytes], frontier: Mapping[Node, bytes]
) -> dict[Node, bytes]:
    """The perfect nodes completed by appending ``leaf_hashes`` to a tree of ``old_size``
    leaves, given that tree's :func:`root_nodes` hashes in ``frontier`` (the only old nodes an
    append combines with)."""
    known: dict[Node, bytes] = dict(frontier)
    created: dict[Node, bytes] = {}
    for i, h in enumerate(leaf_hashes):
        created[(0, old_size + i)] = h
    known.update(created)
    new_size = old_size + len(leaf_hashes)
    level = 1
    while (1 << level) <= new_size:
        first = old_size >> level  # the first node at this level that may be new
        last = new_size >> level  # one past the last complete node
        for i in range(first, last):
            if (i + 1) << level <= old_size:
                continue
            node = node_hash(known[(level - 1, 2 * i)], known[(level - 1, 2 * i + 1)])
            known[(level, i)] = node
            created[(level, i)] = node
        level += 1
    return created


class MemoryTree:
    """A whole tree in memory: for tests, vectors and offline tools."""

    def __init__(self) -> None:
        self.nodes: dict[Node, bytes] = {}
        self.size = 0

    def append_hashes(self, hashes: Sequence[bytes]) -> None:
        frontier = {n: self.nodes[n] for n in root_nodes(self.size)}
        self.nodes.update(new_nodes(self.size, hashes, frontier))
        self.size += len(hashes)

    def append(self, leaves: Sequence[bytes]) -> None:
        self.append_hashes([leaf_hash(x) for x in leaves])

    def root(self, size: int | None = None) -> bytes:
        return root_from(self.size if size is None else size, self.nodes)

    def _get(self, needed: set[Node]) -> Mapping[Node, bytes]:
        return self.nodes

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if size is None else size, self._get)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        return consistency_proof(old_size, self.size if new_size is None else new_size, self._get)


def _check_hash(value: bytes, what: str) -> None:
    if len(value) != HASH_SIZE:
        raise ProofError(f"{what} is {len(value)} bytes, not {HASH_SIZE}")


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that the leaf with hash ``leaf`` is at ``index`` in the tree of ``size`` leaves
    whose root is ``root`` (RFC 9162 §2.1.3.2).

    Raises:
        ProofError: it is not, or an argument is malformed.
    """
    _check_hash(leaf, "the leaf hash")
    _check_hash(root, "the root hash")
    for i, p in enumerate(proof):
        _check_hash(p, f"proof hash {i}")
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not below the tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is shorter than the tree is deep")
    if r != root:
        raise ProofError("the inclusion proof does not lead to the root")


def verify_consistency(
    old_size: int, new_size: int, proof: Sequence[bytes], old_root: bytes, new_root: bytes
) -> None:
    """Check that the tree of ``new_size`` with root ``new_root`` extends the tree of
    ``old_size`` with root ``old_root`` (RFC 9162 §2.1.4.2).

    Raises:
        ProofError: it does not, or an argument is malformed.
    """
    if old_size < 0 or new_size < old_size:
        raise ProofError(f"tree size {new_size} is smaller than {old_size}")
    if old_size == 0:
        raise ProofError("a consistency proof from the empty tree proves nothing")
    if old_size == new_size:
        if proof:
            raise ProofError("equal tree sizes need an empty consistency proof")
        if old_root != new_root:
            raise ProofError(f"two different roots for tree size {old_size}")
        return
    _check_hash(old_root, "the old root hash")
    _check_hash(new_root, "the new root hash")
    for i, p in enumerate(proof):
        _check_hash(p, f"proof hash {i}")
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError("the consistency proof does not lead to the old root")
    if sr != new_root:
        raise ProofError("the consistency proof does not lead to the new root")
