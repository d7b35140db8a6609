"""The words ``affidavit serve`` prints at start-up about how claims are contained: the jail
(or its absence) and which limits bound a claim — a cgroup per claim, or per-process rlimits
only, and why."""

from __future__ import annotations

from affidavit.claims import cgroups
from affidavit.claims.bwrap import find_bwrap
from affidavit.claims.sandbox import DEFAULT_MAX_PROCESSES, SandboxConfig


def containment(config: SandboxConfig | None) -> str:
    """The line for ``config`` (``None``: the default): ``claims: bwrap jail, cgroup v2
    limits (memory 1024 MiB, 256 pids)``, say, or ``claims: bwrap jail, rlimits only (cgroup v2
    has no memory or pids controller here; ...)``."""
    config = config or SandboxConfig()
    if config.isolation == "none":
        jail = "NO sandbox"
    elif find_bwrap() is None:
        jail = "refused (bubblewrap is not installed)"
    else:
        jail = "bwrap jail"
    if not config.cgroup_limits:
        return f"claims: {jail}, rlimits only (cgroup limits turned off)"
    pids = config.max_processes or DEFAULT_MAX_PROCESSES
    return f"claims: {jail}, {cgroups.describe(config.claim_memory_bytes, pids)}"
