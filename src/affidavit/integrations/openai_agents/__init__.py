"""OpenAI Agents SDK integration, the ``affidavit[openai-agents]`` extra:
:class:`AffidavitRunner` runs ``agents.Runner.run`` inside an affidavit agent job.

Every model call is one recorded pure step (asked once; a recovery returns the recorded
response and never asks the model again), every function tool call (an MCP server's tools
included) one tool step through the invocation ledger (at most once; a :func:`ledger_tool`
keeps its ``@affidavit.tool``'s ``reconcile`` hook), tools marked ``needs_approval`` wait for an
affidavit approval, guardrails are recorded, and each response's token usage counts toward the
job's budget. An agent registered with :func:`agent_job` runs, when another agent calls it as
a tool (``agent.as_tool(...)``), as a child job. See docs/integrations.md ("OpenAI Agents SDK").
"""

from __future__ import annotations

try:
    import agents as _agents  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "affidavit.integrations.openai_agents needs the OpenAI Agents SDK, which is not "
        "installed: pip install 'affidavit[openai-agents]' (or pip install openai-agents)"
    ) from _exc

from affidavit.integrations._children import ChildJobFailed
from affidavit.integrations.openai_agents._children import agent_job
from affidavit.integrations.openai_agents._runner import AffidavitRunner, ledger_tool
from affidavit.integrations.openai_agents._steps import STEPS

__all__ = ["STEPS", "AffidavitRunner", "ChildJobFailed", "agent_job", "ledger_tool"]
