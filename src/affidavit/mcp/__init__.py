"""``affidavit mcp``: the MCP face — affidavit's operations served to agents as MCP tools
(:mod:`~affidavit.mcp.server`), over stdio or streamable HTTP behind the HTTP API's own key
checks, rate limit and body cap (:mod:`~affidavit.mcp.http_gate`). It shares API keys, roles
and limits with the HTTP API through :mod:`affidavit.faces`. Needs the ``affidavit[mcp]``
extra.
"""
