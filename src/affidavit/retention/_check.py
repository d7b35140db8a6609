"""What ``affidavit verify JOB`` says of a job retention removed from the live store.

(1) The tombstone names the job's seal by its hash; the seal row, which stays in the live
    store (and its leaf in the transparency log), must still hash to it.
(2) With an archive: the pack file at the recorded path, when present, must hash to the
    recorded SHA-256, verify (MATCH, signed by a recorded key) and carry that seal. A pack no
    longer there is reported, not failed: the archive may have moved (the digest names it).
(3) Without an archive (``--no-archive``) the status is ``removed``: nothing but the seal and
    the tombstone is left to check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from affidavit.core.errors import JobNotFound
from affidavit.core.seal import seal_sha256
from affidavit.retention._archive import pack_problem, sha256_file
from affidavit.store import Store
from affidavit.store.retention import Rows, Tombstone, tombstone_of


class JobArchived(JobNotFound):
    """The job is not in the live store: retention removed it (its tombstone says when, and
    where its pack went)."""

    code = "job_archived"

    def __init__(self, tombstone: Tombstone) -> None:
        where = tombstone.pack_path or "no pack (the policy kept none)"
        super().__init__(tombstone.job_id)
        self.message = f"job {tombstone.job_id} was archived at {tombstone.archived_at}: {where}"
        self.args = (self.message,)
        self.hint = (
            f"`affidavit verify {tombstone.job_id}` on the store's host checks it and its pack; "
            "`affidavit pack verify PACK` checks the pack anywhere."
        )


@dataclass(frozen=True, slots=True)
class ArchivedCheck:
    """The verdict on a removed job: ``status`` ``archived`` (its pack was kept) or
    ``removed`` (no archive); ``ok`` false when a check failed (``problems``);
    ``pack_present`` whether the pack file is at its recorded path (``None``: no pack)."""

    tombstone: Tombstone
    status: str
    ok: bool
    pack_present: bool | None
    problems: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.tombstone.job_id,
            "ok": self.ok,
            "status": self.status,
            "pack_path": self.tombstone.pack_path,
            "pack_sha256": self.tombstone.pack_sha256,
            "pack_present": self.pack_present,
            "seal_sha256": self.tombstone.seal_sha256,
            "archived_at": self.tombstone.archived_at,
            "problems": list(self.problems),
        }


def archived_job(store: Store, job_id: str) -> Tombstone | None:
    """The tombstone of ``job_id`` if retention removed it, else ``None``."""
    with store.snapshot() as snap:
        return tombstone_of(cast(Rows, snap), job_id)


def check_archived(store: Store, job_id: str) -> ArchivedCheck | None:
    """Verify the removed job ``job_id`` (module docstring); ``None`` when it was not removed.
    Never changes anything; never raises on a missing or broken pack (it fails the check)."""
    tomb = archived_job(store, job_id)
    if tomb is None:
        return None
    problems: list[str] = []
    seal = store.get_seal(job_id)  # (1)
    if seal is None:
        problems.append("the job's seal is gone from the store")
    elif seal_sha256(seal) != tomb.seal_sha256:
        problems.append("the stored seal no longer hashes to the one the tombstone records")
    if tomb.pack_path is None:  # (3)
        return ArchivedCheck(tomb, "removed", not problems, None, tuple(problems))
    path = Path(tomb.pack_path)  # (2)
    present = path.is_file()
    if present:
        digest = sha256_file(path)
        if digest != tomb.pack_sha256:
            problems.append(
                f"the pack at {tomb.pack_path} no longer matches: its SHA-256 is {digest}, "
                f"{tomb.pack_sha256} was recorded"
            )
        else:
            keys = [k.public_key for k in store.signing_keys()]
            problem = pack_problem(path, keys, seal_hash=tomb.seal_sha256)
            if problem is not None:
                problems.append(problem)
    return ArchivedCheck(tomb, "archived", not problems, present, tuple(problems))
