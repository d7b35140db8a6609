"""The per-job event hash chain (docs/formats.md §4) and the execution hash (§5).

    H_0 = b""
    H_i = SHA-256(H_{i-1} ‖ "\\n" ‖ event_id ‖ " " ‖ type ‖ " " ‖ base64(payload_bytes))

``H_{i-1}`` enters as its raw 32-byte digest; text parts are UTF-8; base64 is standard with
padding over the stored payload bytes. These functions are shared by the store (which computes
``H_i`` once, at append) and by every verifier (which recomputes it).
"""

from __future__ import annotations

import hashlib
from binascii import b2a_base64 as _b64
from collections.abc import Iterable
from dataclasses import dataclass

GENESIS = b""
_sha256 = hashlib.sha256


def chain_next(previous: bytes, event_id: str, event_type: str, payload: bytes) -> bytes:
    """Return the raw digest ``H_i`` given the raw ``H_{i-1}`` and event i's stored parts."""
    return _sha256(
        b"".join(
            (
                previous,
                b"\n",
                event_id.encode(),
                b" ",
                event_type.encode(),
                b" ",
                _b64(payload, newline=False),  # = base64.b64encode(payload)
            )
        )
    ).digest()


def chain_root(events: Iterable[tuple[str, str, bytes]]) -> str:
    """Hex ``H_n`` over ``(event_id, type, payload_bytes)`` triples in version order."""
    head = GENESIS
    for event_id, event_type, payload in events:
        head = chain_next(head, event_id, event_type, payload)
    return head.hex()


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """Outcome of recomputing a stored chain."""

    ok: bool
    first_bad_version: int | None
    event_count: int
    root: str


def check_stored_chain(events: Iterable[tuple[int, str, str, bytes, str]]) -> ChainCheck:
    """Recompute every ``H_i`` of ``(version, event_id, type, payload, stored_hex)`` rows.

    Reports the first version whose stored hash does not match the recomputation, or whose
    version is not the next in sequence (a gap, a duplicate or a reordering). ``root`` is the
    recomputed ``H_n`` over the rows as given.
    """
    head = GENESIS
    first_bad: int | None = None
    count = 0
    for version, event_id, event_type, payload, stored in events:
        count += 1
        head = chain_next(head, event_id, event_type, payload)
        if first_bad is None and (version != count or head.hex() != stored):
            first_bad = version if version == count else count
    return ChainCheck(first_bad is None, first_bad, count, head.hex())


def execution_hash(plan_hash: str, finished: Iterable[tuple[str, str]]) -> str:
    """``hex(SHA-256(plan_hash ‖ concat(node_id ‖ ":" ‖ result_type ‖ "\\n")))`` over the
    ``(node_id, result_type)`` of ``node_finished`` events in log order."""
    digest = hashlib.sha256(plan_hash.encode("utf-8"))
    for node_id, result_type in finished:
        digest.update(f"{node_id}:{result_type}\n".encode())
    return digest.hexdigest()
