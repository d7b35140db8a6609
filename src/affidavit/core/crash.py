"""Named fault-injection points (docs/formats.md §9).

With ``AFFIDAVIT_CRASH_AT=<point>[:<n>]`` in the environment the process kills itself with
SIGKILL the n-th time (default 1st) it reaches ``point``. ``AFFIDAVIT_STOP_AT`` (same form)
stops it there with SIGSTOP instead — every thread, heartbeats included, as a frozen VM or a
stop-the-world pause would — until someone sends SIGCONT. The variables are read once, at
import; without them :func:`crash_point` is two comparisons.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = frozenset(
    {
        "tool.after_acquire",
        "tool.after_execute",
        "tool.after_timeout",
        "tool.after_commit",
        "pure.after_execute",
        "job.before_complete",
        "agent.replay_step",
        "wait.after_record",
        "sleep.after_record",
        "log.before_integrate",
        "stream.after_emit",
        "child.before_create_commit",
        "child.after_create",
        "child.before_link",
        "retention.after_pack_written",
        "retention.after_pack_verified",
        "retention.before_delete_commit",
        "retention.after_delete_commit",
        "erase.before_commit",
        "erase.after_commit",
    }
)


def _parse(value: str | None) -> tuple[str | None, int]:
    if not value:
        return None, 0
    point, _, count = value.partition(":")
    return point, int(count) if count.isdigit() and int(count) > 0 else 1


_POINT, _TARGET = _parse(os.environ.get("AFFIDAVIT_CRASH_AT"))
_STOP_POINT, _STOP_TARGET = _parse(os.environ.get("AFFIDAVIT_STOP_AT"))
_seen = 0
_stops_seen = 0
# Counting is locked: a worker runs jobs (and a job its steps) on several threads, and the n-th
# arrival must be exactly one of them. Only a configured point takes the lock.
_count_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup, no flush) if this is the configured crash point; stop
    here (SIGSTOP) if it is the configured stop point."""
    global _seen, _stops_seen
    if name == _POINT:
        with _count_lock:
            _seen += 1
            here = _seen == _TARGET
        if here:
            os.kill(os.getpid(), signal.SIGKILL)
    if name == _STOP_POINT:
        with _count_lock:
            _stops_seen += 1
            here = _stops_seen == _STOP_TARGET
        if here:
            os.kill(os.getpid(), signal.SIGSTOP)
