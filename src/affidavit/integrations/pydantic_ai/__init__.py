"""Pydantic AI integration, the ``affidavit[pydantic-ai]`` extra: :class:`AffidavitAgent` runs a
Pydantic AI ``Agent`` as an affidavit agent job.

Every model request is one recorded pure step (asked once; a recovery returns the recorded
response and never asks the model again), every tool call — function tools, MCP servers' tools,
any toolset — is one tool step through the invocation ledger (at most once; reconciled, parked or
failed when caught in flight), and tool calls that need a person's approval wait as affidavit
approvals. See docs/integrations.md ("Pydantic AI").
"""

from __future__ import annotations

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "affidavit.integrations.pydantic_ai needs Pydantic AI, which is not installed: "
        "pip install 'affidavit[pydantic-ai]' (or pip install pydantic-ai-slim)"
    ) from _exc

from affidavit.integrations.pydantic_ai._agent import AffidavitAgent

__all__ = ["AffidavitAgent"]
