"""Reading a pack's files without trusting it: relative paths that stay inside the pack, and
missing or unreadable files as a failed check (:class:`~affidavit.packs._state.Fail`)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

from affidavit.packs._state import Fail

# One plain file name: nothing to resolve inside a directory already checked.
SIMPLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*\Z")


def safe_path(
    root: Path, rel: Any, what: str, *, plain: bool = False, within: Path | None = None
) -> Path:
    """``root/rel`` when ``rel`` is a relative path that stays inside ``root``. ``plain``: the
    caller checked that ``root`` is a real directory inside the pack (see :func:`plain_dir`),
    so a single plain file name that is not a symlink needs no resolving."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise Fail(f"{what}: {rel!r} is not a relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise Fail(f"{what}: {rel!r} escapes the pack directory")
    path = root / rel
    if plain and SIMPLE.match(rel) and not path.is_symlink():
        return path  # one plain name in a directory already checked: nothing to resolve
    try:
        path.resolve().relative_to((within or root).resolve())
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        raise Fail(f"{what}: {rel!r} escapes the pack directory") from None
    return path


def plain_dir(root: Path, sub: str) -> bool:
    """``root/sub`` is a real directory (not a symlink) that resolves inside ``root``."""
    path = root / sub
    try:
        if path.is_dir() and not path.is_symlink():
            path.resolve().relative_to(root.resolve())
            return True
    except (ValueError, OSError, RuntimeError):
        pass
    return False


def too_large(what: str, size: int, limit: int) -> Fail:
    return Fail(
        f"{what}: {size:,} bytes, more than the {limit:,} a file of a pack may hold "
        "(--max-file-bytes, $AFFIDAVIT_PACK_MAX_FILE_BYTES)"
    )


def read(path: Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; :class:`Fail`
    naming ``what`` otherwise. A larger file is refused by its size before it is read (a
    sparse file of gigabytes costs nothing), and at most ``limit + 1`` bytes are read of one
    that grows meanwhile."""
    try:
        if not path.is_file():
            raise Fail(f"{what}: missing")
        size = path.stat().st_size
        if size > limit:
            raise too_large(what, size, limit)
        with path.open("rb") as f:
            data = f.read(size + 1)  # (a read of n bytes allocates n: not the limit)
            if len(data) > size:  # it grew since
                data += f.read(limit + 1 - len(data))
    except OSError as exc:
        raise Fail(f"{what}: cannot be read ({exc.strerror})") from None
    if len(data) > limit:
        raise too_large(what, len(data), limit)
    return data


# No symlink followed, no blocking on a FIFO swapped in after the lstat.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd


class PlainFiles:
    """Reads plain files (:data:`SIMPLE` names, regular files, not symlinks) in a directory that
    :func:`plain_dir` checked — one lstat, open, read and close per file, relative to the open
    directory, with no path objects: a pack holds one recorded trace per step.

    Use as a context manager (it holds the directory open). :meth:`read` answers ``None`` for
    anything else — another name, a symlink, a missing or unreadable file — and the caller then
    takes the checked path (:func:`safe_path` and :func:`read`), which accepts or names it
    exactly as before.
    """

    def __init__(self, directory: Path, limit: int) -> None:
        self._dir = os.fspath(directory)
        self._limit = limit  # larger files: None (the checked path names them)
        self._fd: int | None = None

    def __enter__(self) -> PlainFiles:
        if _DIR_FD:
            try:
                self._fd = os.open(self._dir, _OPEN_FLAGS | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                self._fd = None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, name: str) -> bytes | None:
        """The bytes of the plain regular file ``name``; ``None`` when it is not one or cannot
        be read."""
        if not SIMPLE.match(name):
            return None
        dir_fd = self._fd
        path = name if dir_fd is not None else os.path.join(self._dir, name)
        try:
            info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_size > self._limit:
                return None
            fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            data = os.read(fd, info.st_size + 1)
            while len(data) <= self._limit and (chunk := os.read(fd, 1 << 16)):
                data += chunk  # (until the end, as Path.read_bytes reads, or past the limit)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) <= self._limit else None
