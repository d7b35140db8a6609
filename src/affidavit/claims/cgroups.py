"""Per-claim resource bounds: one cgroup leaf per claim, holding every process of the claim.

Per-process limits (:mod:`affidavit.claims.rlimits`) bound each process alone: a claim that
forks N children may use N times the memory, and the process-count limit is not enforced for
a service running as root. A cgroup bounds the claim as a whole — ``memory.max`` (cgroup v2) or
``memory.limit_in_bytes`` (v1) over every process and the pages of its private ``/tmp``, and
``pids.max`` over every process and thread it starts. When a limit is hit the kernel refuses
the fork or kills the claim (the OOM killer within the leaf); what happened is read back into
the evidence.

Where they come from: the service's own cgroup (``/proc/self/cgroup``), in the hierarchy that
has the ``memory`` and ``pids`` controllers — cgroup v2 (``cgroup.controllers`` lists them and
the service's cgroup can delegate them: it must hold no process itself, the v2 rule, unless it
is the root) or, on a host that still binds them to cgroup v1 hierarchies, those. A directory
``affidavit-claims`` is made below it, and a leaf per claim below that. :func:`support` probes
once by moving a real process into a leaf; where that fails, it says why, and claims run with
the per-process limits only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

_GROUP = "affidavit-claims"
_EMPTY_WAIT_S = 2.0
_STALE_S = 600.0  # an empty leaf this old is left over, not about to be joined


@dataclass(frozen=True, slots=True)
class Support:
    """Which cgroup kind bounds claims here: ``"v2"``, ``"v1"``, or ``""`` with ``reason``."""

    kind: str
    memory_dir: str = ""  # the parent of the leaves, in the memory (v1) or unified (v2) tree
    pids_dir: str = ""  # v1: in the pids tree; v2: the same as memory_dir
    reason: str = ""


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root within the hierarchy, fstype, super options) of cgroup mounts."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], fields[3], rest[0], rest[2]))
    return found


def _own() -> dict[str, str]:
    """The service's cgroup per controller (``""`` for the unified v2 hierarchy)."""
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f.read().splitlines():
                _, controllers, path = line.split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    own[name] = path
    except (OSError, ValueError):
        pass
    return own


def _under(mount: str, root: str, path: str) -> str:
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return os.path.join(mount, path.lstrip("/"))


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return ""


def _v2() -> Support:
    own = _own().get("")
    mounts = [m for m in _mounts() if m[2] == "cgroup2"]
    if own is None or not mounts:
        return Support("", reason="no cgroup v2 hierarchy is mounted")
    mount, root, _, _ = mounts[0]
    base = _under(mount, root, own)
    available = _read(os.path.join(base, "cgroup.controllers")).split()
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return Support("", reason=f"cgroup v2 has no {' or '.join(missing)} controller here")
    group = os.path.join(base, _GROUP)
    try:
        os.makedirs(group, exist_ok=True)
        # Only the root may delegate while it holds processes (the v2 rule): elsewhere this
        # fails (EBUSY) while the service itself is in ``base``.
        _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
        _write(os.path.join(group, "cgroup.subtree_control"), "+memory +pids")
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.EBUSY:
            why = "the service's own cgroup holds processes, so it cannot delegate controllers"
        return Support("", reason=f"cgroup v2 not delegated here ({base}: {why})")
    return Support("v2", group, group)


def _v1() -> Support:
    own = _own()
    dirs: dict[str, str] = {}
    for mount, root, fstype, options in _mounts():
        for controller in ("memory", "pids"):
            if fstype == "cgroup" and controller in options.split(",") and controller in own:
                dirs[controller] = os.path.join(_under(mount, root, own[controller]), _GROUP)
    if len(dirs) < 2:
        return Support("", reason="no memory and pids cgroup v1 hierarchies either")
    try:
        for path in dirs.values():
            os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return Support("", reason=f"cgroup v1 not writable here ({exc.strerror})")
    return Support("v1", dirs["memory"], dirs["pids"])


@functools.cache
def support() -> Support:
    """The cgroup kind that bounds claims on this host (probed once, with a real process)."""
    found = _v2()
    if not found.kind:
        v1 = _v1()
        if not v1.kind:
            return Support("", reason=f"{found.reason}; {v1.reason}")
        found = v1
    _prune(found)
    try:
        with Leaf.create(found, 64 << 20, 8) as leaf:
            proc = subprocess.run(["/bin/true"], preexec_fn=leaf.join, check=False)
            if proc.returncode != 0:
                raise OSError(0, f"a probe in the leaf exited {proc.returncode}")
    except (OSError, subprocess.SubprocessError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return Support("", reason=f"cgroup {found.kind} leaf cannot hold a process ({reason})")
    return found


@dataclass(slots=True)
class Leaf:
    """One claim's cgroup: made with its limits, joined by the claim's first process (before
    it execs anything), emptied and removed after."""

    kind: str
    dirs: tuple[str, ...]  # v2: (leaf,); v1: (memory leaf, pids leaf)

    @classmethod
    def create(cls, where: Support, memory_bytes: int, pids: int) -> Leaf:
        name = f"claim-{uuid.uuid4().hex}"
        if where.kind == "v2":
            leaf = cls("v2", (os.path.join(where.memory_dir, name),))
            os.mkdir(leaf.dirs[0])
            settings = {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": pids}
        else:
            leaf = cls(
                "v1", (os.path.join(where.memory_dir, name), os.path.join(where.pids_dir, name))
            )
            for path in leaf.dirs:
                os.mkdir(path)
            settings = {
                "memory.limit_in_bytes": memory_bytes,
                "memory.memsw.limit_in_bytes": memory_bytes,
                "pids.max": pids,
            }
        try:
            for file, value in settings.items():
                leaf._set(file, value, optional=file.startswith("memory.s") or "memsw" in file)
        except OSError:
            leaf.remove()
            raise
        return leaf

    def _set(self, file: str, value: int, *, optional: bool) -> None:
        for path in self.dirs:
            target = os.path.join(path, file)
            if os.path.exists(target):
                try:
                    _write(target, str(value))
                except OSError:
                    if not optional:
                        raise
                return
        if not optional:
            raise OSError(2, f"{file} is missing")

    @property
    def join(self) -> Callable[[], None]:
        """Runs in the child between fork and exec: move it into the leaf."""
        procs = [os.path.join(path, "cgroup.procs") for path in self.dirs]
        getpid, open_, write, close = os.getpid, os.open, os.write, os.close

        def join() -> None:
            pid = str(getpid()).encode()
            for path in procs:
                fd = open_(path, os.O_WRONLY)
                try:
                    write(fd, pid)
                finally:
                    close(fd)

        return join

    def report(self) -> dict[str, int | str]:
        """What the kernel counted: the peak memory, OOM kills, forks refused at pids.max."""
        out: dict[str, int | str] = {"version": self.kind}
        if self.kind == "v2":
            events = _counters(os.path.join(self.dirs[0], "memory.events"))
            out["oom_kills"] = events.get("oom_kill", 0)
            out["peak_memory_bytes"] = _int(os.path.join(self.dirs[0], "memory.peak"))
        else:
            oom = _counters(os.path.join(self.dirs[0], "memory.oom_control"))
            out["oom_kills"] = oom.get("oom_kill", 0)
            out["peak_memory_bytes"] = _int(os.path.join(self.dirs[0], "memory.max_usage_in_bytes"))
        out["forks_refused"] = _counters(os.path.join(self.dirs[-1], "pids.events")).get("max", 0)
        return out

    def remove(self) -> None:
        """Kill whatever is left in the leaf, then remove it."""
        deadline = time.monotonic() + _EMPTY_WAIT_S
        for path in self.dirs:
            while os.path.isdir(path):
                kill = os.path.join(path, "cgroup.kill")
                with contextlib.suppress(OSError):
                    if os.path.exists(kill):
                        _write(kill, "1")
                for pid in _read(os.path.join(path, "cgroup.procs")).split():
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    os.rmdir(path)
                except OSError:
                    if time.monotonic() > deadline:
                        break  # left behind; removed by the next service's _prune
                    time.sleep(0.01)

    def __enter__(self) -> Leaf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _prune(where: Support) -> None:
    """Remove the empty leaves an earlier service left (one that could not be emptied in
    time, or a service that was killed): a leaf that still holds a process stays."""
    now = time.time()
    for parent in {where.memory_dir, where.pids_dir}:
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                path = os.path.join(parent, name)
                with contextlib.suppress(OSError):
                    # A young leaf may be another service's, made and not yet joined.
                    if name.startswith("claim-") and now - os.stat(path).st_mtime > _STALE_S:
                        os.rmdir(path)


def _counters(path: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            found[name] = int(value)
    return found


def _int(path: str) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else -1


def describe(memory_bytes: int | None, pids: int | None, where: Support | None = None) -> str:
    """The start-up line's words for the limits in force on claims (``where``: what
    :func:`support` found, by default)."""
    where = where if where is not None else support()
    if where.kind and memory_bytes is not None and pids is not None:
        return f"cgroup {where.kind} limits (memory {memory_bytes >> 20} MiB, {pids} pids)"
    if where.kind:
        return f"rlimits only (cgroup {where.kind} available, limits not configured)"
    return f"rlimits only ({where.reason})"
