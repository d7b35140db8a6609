"""How a claim's command is started, and what bubblewrap's exit status says of it.

The sandbox (:mod:`affidavit.claims.sandbox`) spawns the command either in bubblewrap's jail
or, unsandboxed, in a scratch directory; this module builds the argv, working directory and
environment for each, and reads back the command's own exit code from bubblewrap's report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from affidavit.claims import rlimits
from affidavit.claims.bwrap import Jail, bwrap_argv


@dataclass(frozen=True, slots=True)
class Launch:
    """The arguments of one ``Popen``: ``status_r``/``status_w`` are bubblewrap's status pipe
    (``-1`` unsandboxed); ``prefixed``: the resource limits are set by ``prlimit`` in the
    argv, not in the child before exec."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    status_r: int
    status_w: int
    prefixed: bool


def plan_launch(
    executable: str,
    args: list[str],
    env: dict[str, str],
    limits: list[tuple[int, int]],
    where: tuple[str, Jail] | str,
    project_dir: str | None,
) -> Launch:
    """The launch of ``executable`` with ``args`` in the jail (``(bwrap, jail)``) or,
    unsandboxed, in ``project_dir`` or the scratch directory ``where``. Sandboxed, it opens
    the status pipe: the caller closes both ends."""
    prefix = rlimits.prlimit_prefix(limits)
    status_r = status_w = -1
    pass_fds: tuple[int, ...] = ()
    if isinstance(where, str):
        argv = [executable, *args]
        cwd, spawn_env = project_dir or where, env
    else:
        bwrap, jail = where
        status_r, status_w = os.pipe()
        argv = bwrap_argv(bwrap, jail, env, [executable, *args], status_w)
        # bubblewrap itself (the sandbox's pid 1) gets no variable of the service's either.
        cwd, spawn_env, pass_fds = "/", {"PATH": "/usr/bin:/bin"}, (status_w,)
    if prefix:
        argv = [*prefix, *argv]
    return Launch(argv, cwd, spawn_env, pass_fds, status_r, status_w, bool(prefix))


def jailed_exit_code(status: dict[str, Any] | None) -> int | None:
    """The command's exit code from bubblewrap's status report (``-N``: killed by signal N),
    or ``None`` when the report has none: bubblewrap could not set up the sandbox or exec the
    program."""
    code = status.get("exit-code") if status is not None else None
    if not isinstance(code, int):
        return None
    # bubblewrap reports a command killed by signal N as 128 + N
    return code if code <= 128 else -(code - 128)
