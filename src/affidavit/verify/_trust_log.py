"""Verifying an agent's trust log: its chain, its seal, its place in the transparency log, and
the scores it states — read on its own, never through the code that wrote it.

The contract, in order (each failure is one problem, in words):

1. the stored chain recomputes (the job-event formula with the entry id and type);
2. the last entry's score is the agent's current score;
3. the scores follow each other: each ``claim_verified`` entry starts at the score the entry
   before it ended at, one that did not count (``counted: false``, a re-verification or an
   ``error``) ends where it started, and no claim counted twice;
4. the log has a seal (:func:`affidavit.core.seal.check_signature`, a recorded key), for the
   record id ``trust:<agent_id>:<n>``, over exactly the ``n`` entries the log holds, whose head
   is entry ``n``'s chain hash — a log cut short (rows deleted, with or without the score set
   back) no longer reaches its seal; entries past the seal were written without the service;
5. the transparency log holds no seal of a longer log (``trust:<agent_id>:<n+1>``): a log cut
   together with its seals is caught by the leaves it already published; and the leaf logged
   for the seal, once integrated, is this seal's — a log rewritten and re-sealed with the key
   is caught by the leaf published before.

What this does not prove: that entries were never cut before their seals reached the
transparency log (``affidavit log integrate`` runs within about a second on a worker or
server), nor — against an operator who rewrites the log tables too — more than the witnesses'
cosigned checkpoints prove (docs/transparency.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.canonical import parse
from affidavit.core.chain import ChainCheck, check_stored_chain
from affidavit.core.seal import PublicKey, Seal, check_signature, log_leaf

# (version, entry_id, type, payload bytes, chain_hash)
TrustRow = tuple[int, str, str, bytes, str]
MAX_PROBLEMS = 10


@dataclass(frozen=True, slots=True)
class TrustLogCheck:
    """The verdict on one agent's trust log; ``ok`` when ``problems`` is empty."""

    entries: int
    first_bad_version: int | None
    root: str | None
    score_matches: bool
    seal: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def record_id(agent_id: str, entry_count: int) -> str:
    """``trust:<agent_id>:<entry_count>``: the id a trust-log seal is signed and logged under."""
    return f"trust:{agent_id}:{entry_count}"


def check_trust_log(
    agent_id: str,
    rows: Sequence[TrustRow],
    *,
    score: float,
    seal: Seal | None,
    keys: Sequence[PublicKey],
    leaf_of: Callable[[str], tuple[bytes | None, bool]],
) -> TrustLogCheck:
    """Run the module contract over the agent's stored trust log ``rows`` (version order), its
    current ``score``, its latest stored ``seal`` and the recorded public ``keys``;
    ``leaf_of(record_id)`` is the transparency log's ``(integrated leaf or None, queued)``."""
    problems: list[str] = []
    chain: ChainCheck = check_stored_chain(rows)  # (1)
    if not chain.ok:
        problems.append(f"trust log entry {chain.first_bad_version} does not chain")
    payloads = [_payload(r[3]) for r in rows]
    last = payloads[-1] if payloads else {}
    matches = last.get("score_after", last.get("trust_score")) == score  # (2)
    if not matches:
        problems.append(
            f"the agent's score {score} is not its trust log's last score "
            f"{last.get('score_after', last.get('trust_score'))}"
        )
    problems += _score_problems(rows, payloads)  # (3)
    problems += _seal_problems(agent_id, rows, seal, keys)  # (4)
    problems += _log_problems(agent_id, len(rows), seal, leaf_of)  # (5)
    return TrustLogCheck(
        entries=chain.event_count,
        first_bad_version=chain.first_bad_version,
        root=chain.root,
        score_matches=matches,
        seal=None if seal is None else {"record_id": seal.job_id, **seal.to_dict()},
        problems=problems[:MAX_PROBLEMS],
    )


def _payload(body: bytes) -> Mapping[str, Any]:
    try:
        value = parse(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _score_problems(rows: Sequence[TrustRow], payloads: Sequence[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    previous: Any = None
    counted: set[str] = set()
    for row, p in zip(rows, payloads, strict=True):
        version = row[0]
        if row[2] == "agent_registered":
            previous = p.get("trust_score")
            continue
        if row[2] != "claim_verified":
            continue
        before, after = p.get("score_before"), p.get("score_after")
        if previous is not None and before != previous:
            problems.append(
                f"trust log entry {version} starts at score {before}, the entry before it "
                f"ended at {previous}"
            )
        moves = p.get("counted", p.get("verdict") != "error")
        if not moves and after != before:
            problems.append(f"trust log entry {version} did not count, yet moved the score")
        claim_id = p.get("claim_id")
        if moves and isinstance(claim_id, str):
            if claim_id in counted:
                problems.append(f"trust log entry {version}: claim {claim_id} counted twice")
            counted.add(claim_id)
        previous = after
    return problems


def _seal_problems(
    agent_id: str, rows: Sequence[TrustRow], seal: Seal | None, keys: Sequence[PublicKey]
) -> list[str]:
    if seal is None:
        return ["the trust log has no seal: nothing signed says how long it is"]
    n = seal.event_count
    problems: list[str] = []
    key = next((k for k in keys if k.key_id == seal.key_id), None)
    why = "" if key is not None else f"seal key {seal.key_id} is not recorded"
    if key is not None:
        why = check_signature(seal, key.public_key)
    if why:
        problems.append(f"the trust log's seal does not verify: {why}")
    if seal.job_id != record_id(agent_id, n):
        problems.append(f"the seal is for {seal.job_id!r}, not {record_id(agent_id, n)!r}")
    if n > len(rows):
        problems.append(
            f"the trust log holds {len(rows)} entries, its seal covers {n}: "
            f"{_span(len(rows) + 1, n)} removed"
        )
    elif rows and n >= 1 and rows[n - 1][4] != seal.event_chain_root_hash:
        problems.append(f"the seal's head is not entry {n}'s chain hash: the log was rewritten")
    if n < len(rows):
        problems.append(f"{_span(n + 1, len(rows))} not sealed: written without the service")
    return problems


def _span(first: int, last: int) -> str:
    """``entry 3 was`` / ``entries 3–5 were``."""
    return f"entry {first} was" if first == last else f"entries {first}–{last} were"


def _log_problems(
    agent_id: str,
    count: int,
    seal: Seal | None,
    leaf_of: Callable[[str], tuple[bytes | None, bool]],
) -> list[str]:
    problems: list[str] = []
    longest = max(count, seal.event_count if seal is not None else 0)
    later_leaf, later_queued = leaf_of(record_id(agent_id, longest + 1))
    if later_leaf is not None or later_queued:
        problems.append(
            f"the transparency log holds the seal of a trust log of {longest + 1} entries: "
            f"this one was cut after entry {longest}"
        )
    if seal is not None:
        logged, _ = leaf_of(seal.job_id)
        if logged is not None and logged != log_leaf(seal):
            problems.append(
                f"the transparency log holds another seal for {seal.job_id}: the trust log was "
                "re-sealed after it was logged"
            )
    return problems
