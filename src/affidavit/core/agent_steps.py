"""Step identity of agent jobs (docs/formats.md, "Agent jobs"): the formulas a verifier recomputes
without the agent's code.

Each ``ctx.*`` call of an agent that records something takes the next sequence number ``seq``
(0, 1, 2, ... in program order) and a kind; its node id is ``"#" + decimal(seq)`` and

    step_id = first 16 hex of SHA-256(job_id ‖ 0x00 ‖ "agent" ‖ 0x00 ‖ decimal(seq) ‖ 0x00 ‖ kind)

Idempotency and external keys follow from the step id as for plan steps.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, get_args

from affidavit.core.canonical import canonical

#: The kinds of recorded agent calls (the type of ``step_called.kind``).
AgentKind = Literal[
    "tool",
    "pure",
    "wait",
    "approval",
    "sleep",
    "now",
    "uuid",
    "random",
    "patched",
    "job",
    "join",
]
AGENT_KINDS: tuple[str, ...] = get_args(AgentKind)

#: The plan node type whose events a call of each kind writes (FORMATS §3 applies unchanged).
NODE_TYPE_OF_KIND: dict[str, str] = {
    "tool": "tool",
    "pure": "pure",
    "wait": "wait",
    "approval": "approval",
    "sleep": "wait",
    "now": "pure",
    "uuid": "pure",
    "random": "pure",
    "patched": "pure",
    "job": "pure",  # ctx.start_job: its output is the child's job id
    "join": "wait",  # ctx.join / join_all: waits for children (wait_type "child")
}


def agent_node_id(seq: int) -> str:
    """The node id of the call numbered ``seq``."""
    return f"#{seq}"


def agent_step_id(job_id: str, seq: int, kind: str) -> str:
    """The step id of an agent job's call ``seq`` of ``kind``."""
    data = b"\x00".join((job_id.encode(), b"agent", str(seq).encode(), kind.encode()))
    return hashlib.sha256(data).hexdigest()[:16]


def agent_hash(name: str, version: str | None) -> str:
    """hex(SHA-256(JCS({"agent": name, "version": version}))): the agent's identity, in the
    execution hash where a plan job has its plan hash (``version`` ``None``: not pinned)."""
    return hashlib.sha256(canonical({"agent": name, "version": version})).hexdigest()


def call_signature(payload: dict[str, Any]) -> dict[str, Any]:
    """What a replayed call must match of a recorded ``step_called``: kind, tool name and
    argument hash."""
    return {
        "kind": payload.get("kind"),
        "tool_name": payload.get("tool_name"),
        "args_hash": payload.get("args_hash"),
    }
