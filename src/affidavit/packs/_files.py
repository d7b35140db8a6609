"""Reading a pack's files without trusting it: relative paths that stay inside the pack, and
missing or unreadable files as a failed check (:class:`~affidavit.packs._state.Fail`)."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from affidavit.packs._state import Fail

# One plain file name: nothing to resolve inside a directory already checked.
SIMPLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


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


def read(path: Path, what: str) -> bytes:
    """The bytes of the regular file at ``path``; :class:`Fail` naming ``what`` otherwise."""
    try:
        if not path.is_file():
            raise Fail(f"{what}: missing")
        return path.read_bytes()
    except OSError as exc:
        raise Fail(f"{what}: cannot be read ({exc.strerror})") from None
