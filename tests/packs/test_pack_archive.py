"""``affidavit pack verify`` on a pack archive (``.tar.gz``): read whole and checked before
anything is verified or written — a corrupted archive is INTEGRITY_FAIL naming the corruption
(even where a tar reader stops early without a word), a hostile one (links, absolute paths,
``..``, too many or too large members, a gzip bomb) is refused before a byte is written."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from affidavit.cli.main import load_commands
from affidavit.packs import (
    ArchiveLimits,
    PackArchiveError,
    export_archive,
    read_pack_archive,
    verify_pack,
)
from tests.packs.helpers import run_job

app = load_commands()
runner = CliRunner()


def _archive(make_runtime: Callable[..., Any], tmp_path: Path) -> bytes:
    rt, job_id = run_job(make_runtime, "refund", tmp_path / "data")
    return export_archive(rt.store, job_id)[0]


def _cli(path: Path, out: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["pack", "verify", str(path), "--out-dir", str(out)])
    return result.exit_code, result.output


def _tar(data: bytes) -> bytes:
    return gzip.decompress(data)


def _headers(tar_bytes: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        return [m.offset for m in tar.getmembers()]


def _mid_header(data: bytes) -> bytes:
    """The archive with the header of a member in its middle damaged (a name byte changed:
    its checksum no longer fits)."""
    raw = bytearray(_tar(data))
    offset = _headers(bytes(raw))[len(_headers(bytes(raw))) // 2]
    raw[offset] ^= 0x01
    return gzip.compress(bytes(raw))


CORRUPTIONS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "bad gzip header": (lambda d: b"\x1f\x8c" + d[2:], "bad gzip header"),
    "bad gzip trailer (crc)": (
        lambda d: d[:-8] + bytes(b ^ 0xFF for b in d[-8:-4]) + d[-4:],
        "incorrect data check",
    ),
    "bad gzip trailer (length)": (
        lambda d: d[:-4] + bytes(b ^ 0xFF for b in d[-4:]),
        "incorrect length check",
    ),
    "truncated": (lambda d: d[: len(d) * 2 // 3], "truncated gzip stream"),
    "truncated trailer": (lambda d: d[:-3], "truncated gzip stream"),
    "bytes after the stream": (lambda d: d + b"\x00garbage", "after the end of the gzip stream"),
    "damaged tar header mid-archive": (_mid_header, "is no valid header"),
    "damaged first tar header": (
        lambda d: gzip.compress(b"\xff" + _tar(d)[1:]),
        "corrupted tar archive",
    ),
    "tar cut inside a member": (
        lambda d: gzip.compress(_tar(d)[: _headers(_tar(d))[-1] + 600]),
        "corrupted tar archive",
    ),
}


def test_an_archive_verifies_like_its_directory(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "pack.tar.gz"
    path.write_bytes(_archive(make_runtime, tmp_path))
    verdict = verify_pack(path)
    assert verdict.verdict == "MATCH" and verdict.errors == []
    code, output = _cli(path, tmp_path / "out")
    assert code == 0 and "MATCH" in output


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_archive_is_integrity_fail_naming_it(
    make_runtime: Callable[..., Any], tmp_path: Path, corruption: str
) -> None:
    damage, reason = CORRUPTIONS[corruption]
    path = tmp_path / "pack.tar.gz"
    path.write_bytes(damage(_archive(make_runtime, tmp_path)))
    verdict = verify_pack(path)
    assert verdict.verdict == "INTEGRITY_FAIL" and verdict.exit_code == 2
    assert any(reason in e for e in verdict.errors), verdict.errors
    code, output = _cli(path, tmp_path / "out")
    assert code == 2 and reason in output


def test_a_mid_archive_damage_a_tar_reader_passes_over_is_found(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    """tarfile stops at the damaged header without an error, so an archive missing half its
    members would look whole: the whole archive is read instead."""
    data = _archive(make_runtime, tmp_path)
    damaged = _mid_header(data)
    with tarfile.open(fileobj=io.BytesIO(damaged), mode="r:gz") as tar:
        reached = tar.getmembers()  # no error
    assert 0 < len(reached) < len(_headers(_tar(data)))
    with pytest.raises(PackArchiveError, match="is no valid header"):
        read_pack_archive(damaged)


def _archive_of(*entries: tarfile.TarInfo | tuple[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return buffer.getvalue()


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _fifo(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.FIFOTYPE
    return info


HOSTILE: dict[str, tuple[bytes, str]] = {
    "symlink": (
        _archive_of(("p/a", b"1"), _link("p/evil", "/etc/passwd", tarfile.SYMTYPE)),
        "neither a regular file nor a directory",
    ),
    "hard link": (
        _archive_of(("p/a", b"1"), _link("p/evil", "p/a", tarfile.LNKTYPE)),
        "neither a regular file nor a directory",
    ),
    "fifo": (_archive_of(("p/a", b"1"), _fifo("p/evil")), "neither a regular file"),
    "absolute path": (_archive_of(("/tmp/evil", b"1")), "not a relative path"),
    "dot dot": (_archive_of(("p/a", b"1"), ("p/../../evil", b"1")), "outside the archive"),
    "two top directories": (_archive_of(("p/a", b"1"), ("q/a", b"1")), "one directory"),
    "a name twice": (_archive_of(("p/a", b"1"), ("p/a", b"2")), "given twice"),
    "a file and a directory": (_archive_of(("p/a", b"1"), ("p/a/b", b"2")), "a file and a"),
    "a top file": (_archive_of(("p", b"1")), "is a file"),
    "empty": (gzip.compress(bytes(10240)), "empty tar archive"),
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_archive_is_refused_before_anything_is_written(
    tmp_path: Path, hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, reason = HOSTILE[hostile]
    monkeypatch.chdir(tmp_path)  # (a relative escape would land here)
    with pytest.raises(PackArchiveError, match=reason):
        read_pack_archive(data)
    path = tmp_path / "pack.tar.gz"
    path.write_bytes(data)
    verdict = verify_pack(path)
    assert verdict.verdict == "INTEGRITY_FAIL" and any(reason in e for e in verdict.errors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack.tar.gz"]


def test_members_are_bounded_in_count_size_and_total(tmp_path: Path) -> None:
    many = _archive_of(*[(f"p/{i}", b"x") for i in range(5)])
    with pytest.raises(PackArchiveError, match="more than 4 entries"):
        read_pack_archive(many, ArchiveLimits(max_members=4))
    assert len(read_pack_archive(many, ArchiveLimits(max_members=5)).files) == 5
    big = _archive_of(("p/a", b"x" * 1000))
    with pytest.raises(PackArchiveError, match="holds 1000 bytes, more than 999"):
        read_pack_archive(big, ArchiveLimits(max_member_bytes=999))
    path = tmp_path / "big.tar.gz"
    path.write_bytes(big)
    assert any("more than 999" in e for e in verify_pack(path, max_file_bytes=999).errors)
    # a gzip bomb: 256 MiB of zeros in a small file, refused once the bound is passed
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as out:
        for _ in range(256):
            out.write(bytes(1 << 20))
    assert len(bomb.getvalue()) < 1 << 20
    with pytest.raises(PackArchiveError, match="unpacks to more than 4194304 bytes"):
        read_pack_archive(bomb.getvalue(), ArchiveLimits(max_total_bytes=4 << 20))


def test_no_pack_at_the_path_is_a_usage_error(tmp_path: Path) -> None:
    code, output = _cli(tmp_path / "nothing.tar.gz", tmp_path / "out")
    assert code == 3 and "no pack directory or archive" in output
