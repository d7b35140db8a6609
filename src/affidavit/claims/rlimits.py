"""Per-process limits of a claim command: CPU seconds, address space, file size, process count,
no core dumps. Each bounds one process; a claim's processes together are bounded by its cgroup
(:mod:`affidavit.claims.cgroups`) where the host has one to give."""

from __future__ import annotations

import functools
import resource
import shutil
from collections.abc import Callable


def wanted(
    cpu_seconds: int, memory_bytes: int | None, file_size_bytes: int | None, processes: int | None
) -> list[tuple[int, int]]:
    """(resource, limit) pairs, each capped at the service's own hard limit (a child cannot
    raise it)."""
    pairs = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu_seconds)]
    if memory_bytes is not None:
        pairs.append((resource.RLIMIT_AS, memory_bytes))
    if file_size_bytes is not None:
        pairs.append((resource.RLIMIT_FSIZE, file_size_bytes))
    if processes is not None:
        pairs.append((resource.RLIMIT_NPROC, processes))
    out = []
    for res, value in pairs:
        hard = resource.getrlimit(res)[1]
        out.append((res, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return out


def limit_setter(limits: list[tuple[int, int]]) -> Callable[[], None]:
    # Runs in the child between fork and exec: no imports, no allocation beyond the call.
    setrlimit = resource.setrlimit

    def apply() -> None:
        for res, value in limits:
            setrlimit(res, (value, value))

    return apply


_PRLIMIT_FLAGS = {
    resource.RLIMIT_CORE: "--core",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_AS: "--as",
    resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_NPROC: "--nproc",
}


@functools.cache
def prlimit() -> str | None:
    # Only the system's own copy, never one from a configurable or project path.
    return shutil.which("prlimit", path="/usr/bin:/bin")


def prlimit_prefix(limits: list[tuple[int, int]]) -> list[str]:
    """``prlimit --cpu=N:N ... --`` when util-linux's ``prlimit`` is installed, else ``[]``.

    Either way the limits are set in the child before the program is exec'd, so neither the
    program nor anything it starts runs without them. ``prlimit`` (set limits, then exec) lets
    Python spawn with ``vfork``; a ``preexec_fn`` forces a full ``fork`` and runs Python code in
    the child, about 2 ms slower per command here.
    """
    tool = prlimit()
    if tool is None:
        return []
    return [tool, *(f"{_PRLIMIT_FLAGS[res]}={value}:{value}" for res, value in limits), "--"]


_RESOURCE_NAMES = {
    resource.RLIMIT_CORE: "core_bytes",
    resource.RLIMIT_CPU: "cpu_seconds",
    resource.RLIMIT_AS: "memory_bytes",
    resource.RLIMIT_FSIZE: "file_size_bytes",
    resource.RLIMIT_NPROC: "processes",
}


def resource_name(res: int) -> str:
    return _RESOURCE_NAMES.get(res, str(res))
