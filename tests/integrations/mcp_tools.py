"""A ``--tools`` module for worker processes: registers the tools of the MCP servers file
named by ``AFFIDAVIT_TEST_MCP_SERVERS``, and the agent that uses them."""

import os

import mcp_agent  # noqa: F401  (registers the agent; this file's directory is on sys.path)

from affidavit.integrations.mcp import load_servers

load_servers(os.environ["AFFIDAVIT_TEST_MCP_SERVERS"])
