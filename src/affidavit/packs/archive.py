"""A pack as a ``.tar.gz`` (what ``pack_archive`` and ``GET /api/jobs/{id}/pack`` give), read
whole and in memory, with bounds, before anything of it is verified or written.

Every byte is read and checked, not only the members a tar reader reaches: the gzip stream to
its end (its CRC-32 and length trailer; nothing after it), every 512-byte tar block (a header
that is not one, where a tar reader would stop early and report a shorter archive, is an
error, as is anything but zeros after the end-of-archive marker) and each member's data (a
truncated member is an error). The members are bounded in count, in size each and in all;
only regular files and directories under one top directory are accepted — no link, device or
FIFO, no absolute path, no ``..``, no name twice.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from affidavit.packs._errors import PackArchiveError

__all__ = ["ArchiveLimits", "PackArchive", "read_pack_archive", "write_members"]

_BLOCK = 512
_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """How much a pack archive may hold: members, bytes of one member, bytes in all."""

    max_members: int = 100_000
    max_member_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PackArchive:
    """The checked content of a pack archive: its top directory's name, the directories and
    the files (a path relative to the top directory → its bytes)."""

    top: str
    directories: tuple[str, ...]
    files: dict[str, bytes]


def _gunzip(data: bytes, limit: int) -> bytes:
    """The whole gzip stream of ``data``, decompressed, at most ``limit`` bytes; its trailer is
    checked and nothing may follow it."""
    if data[:2] != b"\x1f\x8b":
        raise PackArchiveError("not a gzip file (bad gzip header: no magic bytes 1f 8b)")
    inflater = zlib.decompressobj(wbits=31)
    out = bytearray()
    rest = data
    try:
        while rest and not inflater.eof:
            out += inflater.decompress(rest, _CHUNK)
            rest = inflater.unconsumed_tail
            if len(out) > limit:
                raise PackArchiveError(f"pack archive unpacks to more than {limit} bytes")
        if not inflater.eof:
            out += inflater.flush()
    except zlib.error as exc:
        raise PackArchiveError(f"corrupted gzip stream: {exc}") from exc
    if not inflater.eof:
        raise PackArchiveError("truncated gzip stream: it ends before its trailer")
    if inflater.unused_data:
        raise PackArchiveError(
            f"{len(inflater.unused_data)} bytes after the end of the gzip stream"
        )
    return bytes(out)


def _name(member: tarfile.TarInfo) -> PurePosixPath:
    raw = member.name
    path = PurePosixPath(raw)
    if not raw or raw.startswith("/") or "\\" in raw or "\x00" in raw:
        raise PackArchiveError(f"pack archive entry {raw!r}: not a relative path")
    if any(part == ".." for part in path.parts):
        raise PackArchiveError(f"pack archive entry {raw!r} leads outside the archive ('..')")
    if not path.parts or path.parts == (".",):
        raise PackArchiveError(f"pack archive entry {raw!r} names nothing")
    return path


def _members(tar_bytes: bytes, limits: ArchiveLimits) -> list[tuple[tarfile.TarInfo, bytes]]:
    members: list[tuple[tarfile.TarInfo, bytes]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            while True:
                member = tar.next()
                if member is None:
                    break
                if len(members) >= limits.max_members:
                    raise PackArchiveError(
                        f"pack archive holds more than {limits.max_members} entries"
                    )
                if not (member.isreg() or member.isdir()):
                    raise PackArchiveError(
                        f"pack archive entry {member.name!r} is neither a regular file nor a "
                        "directory (links, devices and FIFOs are refused)"
                    )
                if member.size > limits.max_member_bytes:
                    raise PackArchiveError(
                        f"pack archive entry {member.name!r} holds {member.size} bytes, more "
                        f"than {limits.max_member_bytes}"
                    )
                start, end = member.offset_data, member.offset_data + member.size
                if member.isreg() and end > len(tar_bytes):
                    raise PackArchiveError(f"pack archive entry {member.name!r} is truncated")
                members.append((member, tar_bytes[start:end] if member.isreg() else b""))
            stopped = tar.offset
    except tarfile.TarError as exc:
        raise PackArchiveError(f"corrupted tar archive: {exc}") from exc
    if len(tar_bytes) % _BLOCK:
        raise PackArchiveError(f"corrupted tar archive: {len(tar_bytes)} bytes, not whole blocks")
    tail = tar_bytes[stopped:]
    if tail.strip(b"\x00"):
        at = stopped + (len(tail) - len(tail.lstrip(b"\x00")))
        raise PackArchiveError(
            f"corrupted tar archive: the block at byte {at - at % _BLOCK} is no valid header "
            "(the archive would end early there)"
        )
    if not members:
        raise PackArchiveError("an empty tar archive holds no pack")
    return members


def read_pack_archive(data: bytes, limits: ArchiveLimits | None = None) -> PackArchive:
    """Read and check the pack archive ``data`` (the bytes of a ``.tar.gz``; module docs).

    Raises:
        PackArchiveError: the archive is corrupted, too large, or holds what a pack does not,
            the message naming what and where.
    """
    limits = limits or ArchiveLimits()
    members = _members(_gunzip(data, limits.max_total_bytes), limits)
    tops = {_name(m).parts[0] for m, _ in members}
    if len(tops) != 1:
        raise PackArchiveError(
            f"a pack archive holds one directory, not {len(tops)} top-level entries"
        )
    top = tops.pop()
    directories: list[str] = []
    files: dict[str, bytes] = {}
    seen: set[str] = set()
    for member, content in members:
        relative = PurePosixPath(*_name(member).parts[1:]).as_posix()
        if relative in seen:
            raise PackArchiveError(f"pack archive entry {member.name!r} is given twice")
        seen.add(relative)
        if member.isdir():
            directories.append(relative)
        elif relative == ".":
            raise PackArchiveError(f"the pack archive's top entry {top!r} is a file")
        else:
            files[relative] = content
    parents = {str(p) for f in files for p in PurePosixPath(f).parents}
    clash = sorted(parents & set(files))
    if clash:
        raise PackArchiveError(f"pack archive entry {clash[0]!r} is a file and a directory")
    return PackArchive(top, tuple(d for d in directories if d != "."), files)


def write_members(archive: PackArchive, into: Path) -> Path:
    """Write ``archive``'s directories and files under ``into`` (a fresh, empty directory):
    only the checked names, as new files (never through a link). Returns the pack directory.
    """
    root = into / archive.top
    root.mkdir()
    for directory in sorted(archive.directories):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for relative, content in archive.files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as out:
            out.write(content)
    return root
