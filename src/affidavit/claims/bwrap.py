"""The bubblewrap jail a claim command runs in.

What the command sees, and nothing else:

1. new user, pid, network, IPC and UTS namespaces; inside, uid and gid 65534 (``nobody``) with
   no capabilities, and a fresh ``/proc`` that shows only the sandbox's own processes;
2. read-only: the system directories (``/usr`` and the ``/bin``, ``/lib``... links or
   directories), a few files of ``/etc`` (users, the dynamic linker's cache, the time zone),
   the interpreter's prefixes (``sys.prefix``, ``sys.base_prefix``) and the search path's
   directories, and the project directory when one is configured;
3. a private, size-limited ``/tmp`` (the home and scratch directory, the working directory when
   there is no project) and a minimal ``/dev``;
4. an environment built from scratch — bubblewrap itself is started with only ``PATH``, so not
   even the sandbox's init (pid 1, whose ``/proc/1/environ`` the command can read) carries the
   service's variables;
5. bubblewrap dies with its parent, and when the sandbox's init dies the kernel kills every
   process of the pid namespace: nothing outlives a claim, however it forked or ``setsid``.

Paths the service must never show (the signing key, the database, the data directory) are
checked against every bound path before anything runs: a configuration that would bind one
of them is refused (:class:`SandboxUnavailable`).
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from affidavit.claims import exposure
from affidavit.core.errors import ClaimRejected

SANDBOX_UID = 65534
PACKAGE = "bubblewrap"
# The operator's explicit way to run claims without the jail (serve/CLI option name).
OPT_OUT_FLAG = "--insecure-claims-without-sandbox"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
)


class SandboxUnavailable(ClaimRejected):
    """Claim commands cannot run contained here: bubblewrap is missing, or the configuration
    would show the sandbox a protected path. Nothing ran."""

    code = "sandbox_unavailable"
    default_hint = (
        f"Install the `{PACKAGE}` package (Debian/Ubuntu: apt-get install {PACKAGE}). Only if "
        "every claim's command is trusted, run without the sandbox: "
        f"`affidavit serve {OPT_OUT_FLAG}` (or the same option of `affidavit claims`)."
    )


@functools.cache
def find_bwrap() -> str | None:
    """The system's ``bwrap`` (never one from a configurable or project path), or ``None``."""
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


def require_bwrap() -> str:
    """The path of ``bwrap``.

    Raises:
        SandboxUnavailable: it is not installed.
    """
    found = find_bwrap()
    if found is None:
        raise SandboxUnavailable(
            f"claim commands run in a bubblewrap sandbox, and `bwrap` (package `{PACKAGE}`) "
            "is not installed; the claim was refused and nothing ran"
        )
    return found


def _real(path: str) -> str:
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class Jail:
    """The paths a sandbox shows (read-only), its working directory and its scratch size."""

    read_only: tuple[str, ...]
    project: str | None
    scratch_bytes: int
    aliases: tuple[tuple[str, str], ...] = ()  # (real path, the path as named)

    def check(self, protected: Sequence[str]) -> None:
        """Refuse a jail that would show a protected path, by its name or by a hard link.

        Raises:
            SandboxUnavailable: a bound path contains (or is) a protected path, or a file
                the jail would show is a protected file (:mod:`affidavit.claims.exposure`).
        """
        system = [p for p in (*_SYSTEM_DIRS, *_ETC_FILES) if os.path.exists(p)]
        shown = [*system, *self.read_only, *([self.project] if self.project else [])]
        for secret in protected:
            target = _real(secret)
            for bound in shown:
                if _inside(target, _real(bound)):
                    raise SandboxUnavailable(
                        f"the claim sandbox would show {secret!r} (inside {bound!r}); "
                        "the claim was refused and nothing ran",
                        hint="Keep the signing key, the database and the data directory "
                        "outside the project directory and the interpreter's directories "
                        "(docs/claims.md, where keys live).",
                    )
        linked = exposure.problem(self.project, [*system, *self.read_only], protected)
        if linked is not None:
            raise SandboxUnavailable(
                f"{linked}; the claim was refused and nothing ran",
                hint="Remove the extra link (a hard link is the same file under another name) "
                "and keep the signing key and the database off the project's file system "
                "(docs/claims.md, where keys live).",
            )


def interpreter_paths() -> list[str]:
    """The running interpreter's prefixes and what its tools import, which the allowed Python
    tools need wherever the installation lives: the real directory of the executable, the
    site-packages directories and the directories their ``.pth`` files add (an editable
    install's source). A tool in the jail starts with a fresh environment, so this is its
    whole import path; the service's own run-time additions to ``sys.path`` are not."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.dirname(_real(sys.executable))))
    for packages in site.getsitepackages():
        paths.add(packages)
        paths.update(_pth_dirs(packages))
    return sorted(p for p in paths if p and os.path.isdir(p))


def _pth_dirs(packages: str) -> list[str]:
    """The directories the ``.pth`` files of ``packages`` add to the import path."""
    found: list[str] = []
    try:
        names = sorted(n for n in os.listdir(packages) if n.endswith(".pth"))
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(packages, name), encoding="utf-8") as f:
                lines = f.read(1 << 16).splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                found.append(os.path.normpath(os.path.join(packages, line)))
    return found


def jail_for(search_path: str, project: str | None, scratch_bytes: int) -> Jail:
    """The jail of a command: system, interpreter and search-path directories (those outside
    the system directories), and the project. A path reached through a symlink is bound at its
    real path and at the path as named (a shebang names the latter)."""
    extra: list[str] = []
    aliases: list[tuple[str, str]] = []
    for path in [*interpreter_paths(), *search_path.split(os.pathsep)]:
        if not path or not os.path.isabs(path) or not os.path.isdir(path):
            continue
        real = _real(path)
        named = os.path.normpath(path)
        if named != real and not any(_inside(named, d) for d in ("/usr", *extra)):
            aliases.append((real, named))
        if any(_inside(real, d) for d in ("/usr", *extra)):
            continue
        extra = [d for d in extra if not _inside(d, real)] + [real]
    return Jail(tuple(sorted(extra)), project, scratch_bytes, tuple(aliases))


def why_not_started(executable: str, jail: Jail) -> str:
    """More of the reason a program found on the host could not be exec'd in the jail: a
    script whose interpreter (its ``#!`` line) is missing or not shown there. ``""`` if none
    is known."""
    try:
        with open(executable, "rb") as f:
            first = f.readline(512)
    except OSError:
        return ""
    if not first.startswith(b"#!"):
        return ""
    words = first[2:].decode("utf-8", "replace").split()
    interpreter = words[0] if words else ""
    if not interpreter:
        return "; its #! line names no interpreter"
    if not os.path.exists(interpreter):
        return f"; its interpreter {interpreter!r} (its #! line) does not exist"
    shown = [*_SYSTEM_DIRS, *jail.read_only, *(d for _, d in jail.aliases)]
    if jail.project is not None:
        shown.append(_real(jail.project))
    if not any(_inside(os.path.normpath(interpreter), d) for d in shown):
        return f"; its interpreter {interpreter!r} (its #! line) is not shown in the sandbox"
    return ""


def _binds(jail: Jail, under_tmp: bool) -> list[str]:
    """``--ro-bind`` words for the jail's paths inside ``/tmp`` (bound over the private
    tmpfs, after it) or outside it (before)."""
    out: list[str] = []
    for source, dest in [*((p, p) for p in jail.read_only), *jail.aliases]:
        if _inside(dest, "/tmp") == under_tmp:
            out += ["--ro-bind", source, dest]
    return out


def bwrap_argv(
    bwrap: str,
    jail: Jail,
    env: dict[str, str],
    argv: Sequence[str],
    status_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line that runs ``argv`` in ``jail`` with exactly ``env``."""
    out = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "claim",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
    ]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
    for path in _ETC_FILES:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    out += _binds(jail, under_tmp=False)
    out += ["--proc", "/proc", "--dev", "/dev"]
    out += ["--size", str(jail.scratch_bytes), "--tmpfs", "/tmp"]
    out += _binds(jail, under_tmp=True)  # an installation under /tmp stays visible
    if jail.project is not None:
        project = _real(jail.project)
        out += ["--ro-bind", project, project, "--chdir", project]
    else:
        out += ["--chdir", "/tmp"]
    out.append("--clearenv")
    for name, value in env.items():
        out += ["--setenv", name, value]
    if status_fd is not None:  # {"exit-code": N} is written only if the command ran
        out += ["--json-status-fd", str(status_fd)]
    out += ["--", *argv]
    return out
