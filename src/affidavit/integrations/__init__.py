"""Framework integrations, each an optional extra built on affidavit's public API only:

- :mod:`affidavit.integrations.mcp` (``affidavit[mcp]``): MCP servers' tools as affidavit tools
  through the ledger, and ``affidavit mcp``, which serves affidavit's operations to agents;
- :mod:`affidavit.integrations.otel` (``affidavit[otel]``): OpenTelemetry spans for jobs, steps
  and tool calls;
- :mod:`affidavit.integrations.pydantic_ai` (``affidavit[pydantic-ai]``): a Pydantic AI agent as
  a durable agent job (``AffidavitAgent``).

Nothing here is imported by ``import affidavit``.
"""
