"""MCP (Model Context Protocol) integration, the ``affidavit[mcp]`` extra.

- :mod:`affidavit.integrations.mcp.server`: ``affidavit mcp``, affidavit's operations served to
  agents as MCP tools.
"""
