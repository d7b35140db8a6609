"""Pydantic AI integration, the ``affidavit[pydantic-ai]`` extra: :class:`AffidavitDurability`,
Pydantic AI's durability capability for affidavit agent jobs
(``Agent(name="support", capabilities=[AffidavitDurability()])``).

Every model request is one recorded pure step (asked once; a recovery returns the recorded
response and never asks the model again), every tool call — function tools, MCP servers' tools
— is one tool step through the invocation ledger named after the tool (at most once;
reconciled, parked or failed when caught in flight; the tool calls of one model turn run
concurrently), MCP servers' tool lists are recorded, and tool calls that need a person's
approval wait as affidavit approvals; ``await other_agent.run(prompt)`` in the job's own code
(a ``durable=False`` tool) runs that agent, when it has its own capability, as a child job.
:class:`AffidavitAgent` is the deprecated wrapper of earlier releases. See
docs/integrations.md ("Pydantic AI").
"""

from __future__ import annotations

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "affidavit.integrations.pydantic_ai needs Pydantic AI, which is not installed: "
        "pip install 'affidavit[pydantic-ai]' (or pip install pydantic-ai-slim)"
    ) from _exc

from affidavit.integrations._children import ChildJobFailed
from affidavit.integrations.pydantic_ai._agent import AffidavitAgent
from affidavit.integrations.pydantic_ai._durability import RECORD_FORMAT, AffidavitDurability

__all__ = ["RECORD_FORMAT", "AffidavitAgent", "AffidavitDurability", "ChildJobFailed"]
