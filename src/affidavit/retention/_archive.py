"""A job's pack in the archive: written whole or not at all, then verified against the live
record before anything of the job is deleted. (The packs are imported on use, so that
``affidavit verify`` of a job in the live store does not load them.)"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from affidavit.core.seal import Seal, seal_sha256

RECEIPTS = "receipt_pack.jsonl"
CHUNK = 1 << 20


def pack_file(archive_dir: Path, job_id: str) -> Path:
    """Where the pack of ``job_id`` goes in ``archive_dir``."""
    return archive_dir / f"pack-{job_id}.tar.gz"


def sha256_file(path: Path) -> str:
    """hex SHA-256 of the file at ``path`` (read in 1 MiB pieces)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(CHUNK):
            digest.update(piece)
    return digest.hexdigest()


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` at ``path``: to a temporary file beside it, flushed to disk, renamed over
    ``path``, and the directory flushed — so after a crash ``path`` holds either what it held
    before or all of ``data``."""
    staging = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with staging.open("xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@dataclass(frozen=True, slots=True)
class PackRecord:
    """What a pack records of its job: its status, chain head and length, its seal's hash."""

    status: str | None
    chain_head: str | None
    event_count: int | None
    seal_sha256: str | None


def pack_record(data: bytes) -> PackRecord:
    """The :class:`PackRecord` of the pack archive ``data``.

    Raises:
        PackArchiveError: the archive cannot be read.
    """
    from affidavit.packs import read_pack_archive  # (the packs load on use: `verify` of a job)

    files = read_pack_archive(data).files
    status = head = count = sealed = None
    for line in files.get(RECEIPTS, b"").splitlines():
        receipt = orjson.loads(line) if line.strip() else None
        if not isinstance(receipt, dict):
            continue
        if receipt.get("type") == "affidavit.event_log/v0":
            status, head = receipt.get("job_status"), receipt.get("event_chain_root_hash")
            count = receipt.get("event_count")
        elif receipt.get("type") == "affidavit.seal/v0" and isinstance(receipt.get("seal"), dict):
            sealed = seal_sha256(Seal.from_dict(receipt["seal"]))
    return PackRecord(
        status if isinstance(status, str) else None,
        head if isinstance(head, str) else None,
        count if isinstance(count, int) else None,
        sealed,
    )


def pack_problem(
    path: Path, trusted_keys: list[bytes], *, seal_hash: str, record: PackRecord | None = None
) -> str | None:
    """Why the pack at ``path`` is not a sound record of the job whose seal hashes to
    ``seal_hash`` (``None``: it is): it must verify (MATCH) with a seal signed by one of
    ``trusted_keys``, carry that very seal and, given ``record``, the same status, chain head
    and length."""
    from affidavit.packs import PackArchiveError, verify_pack

    verdict = verify_pack(path, trusted_keys=trusted_keys)
    if not verdict.ok:
        return f"the pack does not verify ({verdict.verdict}): {'; '.join(verdict.errors[:3])}"
    try:
        found = pack_record(path.read_bytes())
    except (OSError, PackArchiveError, ValueError, TypeError) as exc:
        return f"the pack cannot be read: {exc}"
    if found.seal_sha256 != seal_hash:
        return f"the pack's seal hashes to {found.seal_sha256}, the job's to {seal_hash}"
    if record is not None and (found.status, found.chain_head, found.event_count) != (
        record.status,
        record.chain_head,
        record.event_count,
    ):
        return (
            f"the pack records the job {found.status} at {found.event_count} events "
            f"(head {found.chain_head}), the live store {record.status} at "
            f"{record.event_count} (head {record.chain_head})"
        )
    return None
