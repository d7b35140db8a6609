"""``verify --tree``: a job and every descendant (child jobs, ``ctx.start_job``), as one proof.

The contract, in order:

(1) every job of the tree verifies on its own (:func:`~affidavit.verify.verify_job`);
(2) each ``child_completed`` in a verified parent's log names a child whose current record is
    the one the parent saw: the same final status, chain head, event count and seal hash — a
    child rewritten, extended or re-sealed (even with the operator's key) fails its parent's
    tree;
(3) the child's own log names that parent (its ``job_created``'s ``parent_job_id``);
(4) the descendants the store lists for a job (children it never joined) are verified too.

Read-only; the links come from the parents' logs, which (1) verified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.errors import JobNotFound
from affidavit.core.seal import seal_sha256
from affidavit.store import JobFilter, Store
from affidavit.verify.result import VerificationResult
from affidavit.verify.verification import KeyLike, verify_job

#: The most jobs one tree verification reads (a bound on a hostile tree's size).
MAX_TREE_JOBS = 100_000
_LISTED = 10_000


@dataclass(frozen=True, slots=True)
class TreeLink:
    """One parent-to-child link: ``problem`` is empty when the child is the one recorded."""

    parent_job_id: str
    child_job_id: str
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_job_id": self.parent_job_id,
            "child_job_id": self.child_job_id,
            "ok": not self.problem,
            "problem": self.problem or None,
        }


@dataclass(frozen=True, slots=True)
class TreeResult:
    """The results of every job of the tree (the root first) and of every link."""

    job_id: str
    results: list[VerificationResult] = field(default_factory=list)
    links: list[TreeLink] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not any(link.problem for link in self.links)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "jobs": [r.to_dict() for r in self.results],
            "links": [link.to_dict() for link in self.links],
        }


def verify_tree(
    store: Store, job_id: str, *, trusted_keys: Iterable[KeyLike] | None = None
) -> TreeResult:
    """Verify ``job_id`` and every descendant (see the module docstring); never changes
    anything.

    Raises:
        JobNotFound: no such job (the root).
        StoreError: the database cannot be read.
    """
    keys = list(trusted_keys) if trusted_keys is not None else None
    tree = TreeResult(job_id)
    queue, seen = [job_id], {job_id}
    while queue:
        current = queue.pop(0)
        result = verify_job(store, current, trusted_keys=keys)  # (1)
        tree.results.append(result)
        linked: list[str] = []
        for recorded in _recorded_children(store, current):
            child = str(recorded.get("job_id"))
            linked.append(child)
            tree.links.append(TreeLink(current, child, _link_problem(store, current, recorded)))
        listed = [j.job_id for j in store.list_jobs(JobFilter(parent=current, limit=_LISTED))]
        for child in [*linked, *sorted(set(listed) - set(linked))]:  # (4)
            if child in seen or len(seen) >= MAX_TREE_JOBS:
                continue
            seen.add(child)
            try:
                store.get_job(child)
            except JobNotFound:
                continue  # (its link says so)
            queue.append(child)
    return tree


def _recorded_children(store: Store, job_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in store.iter_events(job_id) if e.type == "child_completed"]


def _link_problem(store: Store, parent: str, recorded: dict[str, Any]) -> str:
    """(2) and (3) for one ``child_completed``: what differs, or ``""``."""
    child_id = str(recorded.get("job_id"))
    try:
        child = store.get_job(child_id)
    except JobNotFound:
        return f"child job {child_id} is not in the store"
    seal = store.get_seal(child_id)
    now = {
        "status": child.status,
        "chain_head": child.head_hash,
        "event_count": child.version,
        "seal_sha256": None if seal is None else seal_sha256(seal),
    }
    differs = [name for name, value in now.items() if recorded.get(name) != value]
    if differs:
        return (
            f"child job {child_id} is not the one its parent recorded: {', '.join(differs)} differ"
        )
    first = store.list_events(child_id, limit=1)
    named = first[0].payload.get("parent_job_id") if first else None
    if named != parent:
        return f"child job {child_id} names parent {named!r}, not {parent}"
    return ""
