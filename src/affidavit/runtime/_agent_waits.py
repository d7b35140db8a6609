"""The checks and payloads of an agent's waits (``ctx.wait``, ``ctx.approval``,
``ctx.sleep``): what :class:`~affidavit.runtime._agent_runner.AgentRun` validates before it
records a wait, what the wait records, and when its timer is due. Pure: nothing here reads or
writes the store."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from affidavit.core.approvals import ApprovalPolicy

MAX_WAIT_KEY = 200


def check_wait(key: Any, timeout: Any) -> None:
    """Refuse a wait key that is not text of 1 to :data:`MAX_WAIT_KEY` characters, or a
    timeout that is not a number ≥ 0 (``None``: no timeout)."""
    if not isinstance(key, str) or not key or len(key) > MAX_WAIT_KEY:
        raise ValueError(f"a wait key must be text of 1 to {MAX_WAIT_KEY} characters")
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        raise ValueError(f"timeout_seconds must be a number ≥ 0, not {timeout!r}")


def check_sleep(seconds: Any) -> None:
    """Refuse a sleep that is not a number of seconds ≥ 0."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise ValueError(f"ctx.sleep takes seconds ≥ 0, not {seconds!r}")


def wait_extra(
    kind: str, args: dict[str, Any], timeout: float | None
) -> tuple[dict[str, Any], float | None]:
    """What a wait of ``kind`` records beyond its key (an approval: who may decide it, checked
    by ``ctx.approval``; a timeout: its ``wake_at``), and the time it wakes at (``None``: no
    timeout)."""
    extra: dict[str, Any] = {}
    if kind == "approval":
        extra.update(
            ApprovalPolicy.parse(args.get("approvers"), args.get("min_approvals"), "").to_dict()
        )
    wake_at: float | None = None
    if timeout is not None:
        wake_at = time.time() + float(timeout)
        extra["wake_at"] = rfc3339(wake_at)
    return extra, wake_at


def timer_due(recorded: dict[str, Any]) -> float | None:
    """When a recorded wait's timer is due (its ``wake_at``), ``None`` for a wait without a
    readable one."""
    wake = recorded.get("wake_at")
    if not isinstance(wake, str):
        return None
    try:
        return datetime.fromisoformat(wake).timestamp()
    except ValueError:
        return None


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
