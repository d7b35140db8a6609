"""What the faces share — the CLI (:mod:`affidavit.cli`), the HTTP API (:mod:`affidavit.api`)
and the MCP server (:mod:`affidavit.mcp`, ``affidavit mcp``): API keys and their roles
(:mod:`~affidavit.faces.auth`), the request limits (:mod:`~affidavit.faces.limits`,
:mod:`~affidavit.faces.ratelimit`), the answers about sealed jobs a server keeps
(:mod:`~affidavit.faces.sealed_cache`) and how an error shows as an exit code or an HTTP status
(:mod:`~affidavit.faces.errors`). Nothing below the faces imports it.
"""
