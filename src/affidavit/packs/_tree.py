"""Proof packs of a job tree (``pack export JOB DIR --tree``, ``pack verify DIR --tree``).

``DIR`` holds ``tree.json`` and one ordinary pack per job, in a directory named by its job id
(each verifies on its own, ours and assay's). ``tree.json``:
``{"format": "affidavit.pack_tree/v1", "root": JOB, "jobs": [{"job_id", "parent_job_id"}]}``,
the root first, then descendants breadth first, children oldest first.

Verifying a tree, in order:

(1) ``tree.json`` is readable, bounded, names the root first, each job once, every other job's
    parent earlier in the list, and only job ids that are one plain path component;
(2) every job's pack verifies MATCH;
(3) each ``child_completed`` of a parent's (verified) event log names a child of the tree
    whose pack records the same final status, chain head, event count and seal hash, and
    whose terminal event holds the output and error the parent recorded;
(4) a child its parent never joined (no ``child_completed``) has only its own pack to verify.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from affidavit.core.errors import AffidavitError
from affidavit.core.inputs import read_limited
from affidavit.core.seal import Seal, seal_sha256
from affidavit.packs.export import export_pack
from affidavit.packs.verify import PackVerdict, verify_pack
from affidavit.store import JobFilter, Store
from affidavit.verify import child_result_problem

TREE_FILE = "tree.json"
TREE_FORMAT = "affidavit.pack_tree/v1"
MAX_TREE_JOBS = 10_000
_MAX_TREE_BYTES = 4 * 1024 * 1024


@dataclass
class TreeVerdict:
    """The verdict of each job's pack and the problems of the tree's links."""

    root: str | None
    packs: dict[str, PackVerdict] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.packs) and all(v.ok for v in self.packs.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "packs": {job: v.verdict for job, v in self.packs.items()},
            "problems": list(self.problems),
        }


def export_tree(
    store: Store, job_id: str, out_dir: Path, *, overwrite: bool = False
) -> dict[str, Any]:
    """Write the pack of ``job_id`` and of every descendant under ``out_dir`` with
    ``tree.json``; returns that document.

    Raises:
        PackExistsError: ``out_dir`` exists and ``overwrite`` is false.
        JobNotFound, UnfinishedJobError, and what :func:`export_pack` raises, for any job.
    """
    from affidavit.packs.export import PackExistsError

    if out_dir.exists() and not overwrite:
        raise PackExistsError(f"{str(out_dir)!r} already exists")
    jobs: list[dict[str, Any]] = [{"job_id": store.get_job(job_id).job_id, "parent_job_id": None}]
    i = 0
    while i < len(jobs) and len(jobs) <= MAX_TREE_JOBS:
        parent = jobs[i]["job_id"]
        children = store.list_jobs(JobFilter(parent=parent, limit=MAX_TREE_JOBS))
        jobs.extend({"job_id": c.job_id, "parent_job_id": parent} for c in reversed(children))
        i += 1
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for entry in jobs:
        export_pack(store, entry["job_id"], out_dir / entry["job_id"])
    doc = {"format": TREE_FORMAT, "root": job_id, "jobs": jobs}
    (out_dir / TREE_FILE).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc


def verify_tree_packs(
    out_dir: Path,
    *,
    trusted_keys: Iterable[bytes | str] | None = None,
    max_file_bytes: int | None = None,
) -> TreeVerdict:
    """Verify the tree of packs in ``out_dir`` (see the module docstring). Never raises on a
    malformed tree: its problems are the verdict's."""
    keys = list(trusted_keys) if trusted_keys is not None else None
    try:
        entries, root = _entries(out_dir)  # (1)
    except (AffidavitError, OSError, ValueError) as exc:
        return TreeVerdict(None, problems=[f"{TREE_FILE}: {exc}"])
    verdict = TreeVerdict(root)
    parents = {e: p for e, p in entries}
    for job_id, _ in entries:  # (2)
        verdict.packs[job_id] = verify_pack(
            out_dir / job_id, trusted_keys=keys, max_file_bytes=max_file_bytes
        )
        if not verdict.packs[job_id].ok:
            verdict.problems.append(f"the pack of job {job_id} is {verdict.packs[job_id].verdict}")
    if verdict.problems:
        return verdict
    for job_id, _ in entries:  # (3)
        for link in _events_of(out_dir / job_id, "child_completed", max_file_bytes):
            child = str(link.get("job_id"))
            if parents.get(child) != job_id:
                verdict.problems.append(f"job {job_id} recorded child {child}, not in the tree")
                continue
            found = _pack_record(out_dir / child, max_file_bytes)
            if len(found) != 4:
                verdict.problems.append(f"the pack of child {child} carries no job record")
                continue
            differs = [k for k, v in found.items() if link.get(k) != v]
            if differs:
                verdict.problems.append(
                    f"the pack of child {child} is not the job its parent {job_id} recorded: "
                    f"{', '.join(differs)} differ"
                )
            elif problem := _result_problem(out_dir / child, child, link, max_file_bytes):
                verdict.problems.append(problem)
    return verdict  # (4): a child its parent never joined has no link to check


def _entries(out_dir: Path) -> tuple[list[tuple[str, str | None]], str]:
    doc = orjson.loads(read_limited(out_dir / TREE_FILE, TREE_FILE, limit=_MAX_TREE_BYTES))
    if not isinstance(doc, dict) or doc.get("format") != TREE_FORMAT:
        raise ValueError(f"not an {TREE_FORMAT} document")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not 1 <= len(jobs) <= MAX_TREE_JOBS:
        raise ValueError(f"jobs must list 1 to {MAX_TREE_JOBS} jobs")
    entries: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for n, e in enumerate(jobs):
        job_id = e.get("job_id") if isinstance(e, dict) else None
        parent = e.get("parent_job_id") if isinstance(e, dict) else None
        if not isinstance(job_id, str) or not _plain_name(job_id) or job_id in seen:
            raise ValueError(f"entry {n}: a job id that is one plain path component, once")
        if (n == 0) != (parent is None) or (n > 0 and parent not in seen):
            raise ValueError(f"entry {n}: the root first, every other job after its parent")
        seen.add(job_id)
        entries.append((job_id, parent))
    if doc.get("root") != entries[0][0]:
        raise ValueError("root is not the first job")
    return entries, entries[0][0]


def _plain_name(name: str) -> bool:
    return (
        0 < len(name) <= 200
        and name.isprintable()
        and name not in (".", "..")
        and not any(c in name for c in "/\\\x00")
    )


def _events_of(pack: Path, event_type: str, limit: int | None) -> list[dict[str, Any]]:
    found = []
    for line in read_limited(pack / "events.ndjson", "events.ndjson", limit=limit).splitlines():
        if line.strip():
            event = orjson.loads(line)
            if event.get("type") == event_type and isinstance(event.get("payload"), dict):
                found.append(event["payload"])
    return found


def _result_problem(pack: Path, child: str, link: dict[str, Any], limit: int | None) -> str:
    """The parent's recorded result of ``child`` against the child's terminal event (the last
    of its verified log)."""
    lines = [
        line
        for line in read_limited(pack / "events.ndjson", "events.ndjson", limit=limit).splitlines()
        if line.strip()
    ]
    last = orjson.loads(lines[-1]) if lines else None
    if not isinstance(last, dict) or not isinstance(last.get("payload"), dict):
        return f"the pack of child {child} has no terminal event"
    return child_result_problem(child, link, str(last.get("type")), last["payload"])


def _pack_record(pack: Path, limit: int | None) -> dict[str, Any]:
    """What a (verified) pack records of its job: status, chain head, length, seal hash."""
    record: dict[str, Any] = {}
    for line in read_limited(pack / "receipt_pack.jsonl", "receipts", limit=limit).splitlines():
        r = orjson.loads(line) if line.strip() else None
        if not isinstance(r, dict):
            continue
        if r.get("type") == "affidavit.event_log/v0":
            record["status"] = r.get("job_status")
            record["chain_head"] = r.get("event_chain_root_hash")
            record["event_count"] = r.get("event_count")
        elif r.get("type") == "affidavit.seal/v0" and isinstance(r.get("seal"), dict):
            record["seal_sha256"] = seal_sha256(Seal.from_dict(r["seal"]))
    return record
