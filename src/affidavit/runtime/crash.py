"""Named fault-injection points (FORMATS.md §9).

With ``AFFIDAVIT_CRASH_AT=<point>[:<n>]`` in the environment the process kills itself with
SIGKILL the n-th time (default 1st) it reaches ``point``. The variable is read once, at import;
without it :func:`crash_point` is a single comparison.
"""

from __future__ import annotations

import os
import signal

POINTS = frozenset(
    {
        "tool.after_acquire",
        "tool.after_execute",
        "tool.after_commit",
        "pure.after_execute",
        "job.before_complete",
    }
)


def _parse(value: str | None) -> tuple[str | None, int]:
    if not value:
        return None, 0
    point, _, count = value.partition(":")
    return point, int(count) if count.isdigit() and int(count) > 0 else 1


_POINT, _TARGET = _parse(os.environ.get("AFFIDAVIT_CRASH_AT"))
_seen = 0


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup, no flush) if this is the configured crash point."""
    global _seen
    if name != _POINT:
        return
    _seen += 1
    if _seen == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)
