"""Files the jail would show that *are* a protected file under another name: hard links.

A path check (is the key inside the project?) misses a hard link: ``ln ~/.affidavit/key
project/notes.txt`` makes the same file — the same device and inode — readable at a path the
jail binds. So the protected files are compared by identity (``st_dev``, ``st_ino``):

- every file of the project directory (the tree an agent's claim is pointed at) is compared
  against them, and a match is refused naming it;
- the other bound trees (the system, the interpreter, the search path) are too big to walk per
  claim; there a protected file with a second link (``st_nlink > 1``) on the same device as a
  bound tree is refused — its other name may be inside.

The protected files are each protected path that is a file, and the files directly inside each
protected directory (the key's directory, the database's: the database, its ``-wal`` and
``-shm``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

MAX_PROJECT_ENTRIES = 200_000  # beyond this the project is judged like the other trees


def protected_files(protected: Iterable[str]) -> dict[tuple[int, int], tuple[str, int]]:
    """(device, inode) → (path, link count) of every protected file."""
    found: dict[tuple[int, int], tuple[str, int]] = {}
    for path in protected:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found[(st.st_dev, st.st_ino)] = (path, st.st_nlink)
        elif stat.S_ISDIR(st.st_mode):
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        s = entry.stat(follow_symlinks=False)
                        found[(s.st_dev, s.st_ino)] = (entry.path, s.st_nlink)
                except OSError:
                    continue
    return found


def _walk(root: str, secrets: dict[tuple[int, int], tuple[str, int]]) -> str | bool | None:
    """The first file under ``root`` that is a protected file (its path), ``None`` if none is,
    or ``False`` when the tree is larger than :data:`MAX_PROJECT_ENTRIES`."""
    pending, seen = [root], 0
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_PROJECT_ENTRIES:
                return False
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    s = entry.stat(follow_symlinks=False)
                    if (s.st_dev, s.st_ino) in secrets:
                        return entry.path
            except OSError:
                continue
    return None


def problem(project: str | None, trees: Sequence[str], protected: Iterable[str]) -> str | None:
    """Why the jail would show a protected file by another name, or ``None``."""
    secrets = protected_files(protected)
    if not secrets:
        return None
    unwalked = list(trees)
    if project is not None:
        hit = _walk(project, secrets)
        if isinstance(hit, str):
            secret = secrets[_identity(hit)][0]
            return f"the project holds {hit!r}, a hard link to the protected file {secret!r}"
        if hit is False:
            unwalked.append(project)
    devices: dict[int, str] = {}
    for tree in unwalked:
        try:
            devices[os.stat(tree).st_dev] = tree
        except OSError:
            continue
    for (device, _), (path, links) in secrets.items():
        if links > 1 and device in devices:
            return (
                f"the protected file {path!r} has {links} hard links, and the sandbox shows "
                f"{devices[device]!r} on the same file system (another name may be inside)"
            )
    return None


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path, follow_symlinks=False)
    return (st.st_dev, st.st_ino)
