"""A ``--tools`` module for worker processes: registers the tools of the MCP servers file
named by ``AFFIDAVIT_TEST_MCP_SERVERS``."""

import os

from affidavit.integrations.mcp import load_servers

load_servers(os.environ["AFFIDAVIT_TEST_MCP_SERVERS"])
