"""Framework integrations, each an optional extra built on affidavit's public API only:

- :mod:`affidavit.integrations.mcp` (``affidavit[mcp]``): MCP servers' tools as affidavit tools
  through the ledger (``affidavit mcp``, which serves affidavit's operations to agents, is a
  face: :mod:`affidavit.mcp`);
- :mod:`affidavit.integrations.openai_agents` (``affidavit[openai-agents]``): the OpenAI Agents
  SDK's ``Runner.run`` recorded in an agent job (``AffidavitRunner``);
- :mod:`affidavit.integrations.otel` (``affidavit[otel]``): OpenTelemetry spans for jobs, steps
  and tool calls;
- :mod:`affidavit.integrations.pydantic_ai` (``affidavit[pydantic-ai]``): a Pydantic AI agent as
  a durable agent job (the ``AffidavitDurability`` capability).

Nothing here is imported by ``import affidavit``, and nothing here imports more of affidavit
than ``affidavit``'s public names (``tests/test_package.py`` holds it to that).
"""
