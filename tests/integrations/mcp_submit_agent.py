"""An agent that ``affidavit mcp --tools`` registers, for ``submit_job``'s agent jobs."""

from __future__ import annotations

from typing import Any

from affidavit import AgentContext, agent


@agent("mcp_greeter", version="1")
def greeter(ctx: AgentContext, name: str) -> dict[str, Any]:
    """Greet ``name`` (no tool: the job's input and output are what the test reads)."""
    return {"greeting": f"hello {name}"}
