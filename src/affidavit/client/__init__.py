"""A Python client for a served affidavit (``affidavit serve``): :class:`Client` and
:class:`AsyncClient`, typed with the API's own models (:mod:`affidavit.api.models`), raising
the server's errors as their :class:`~affidavit.AffidavitError` classes
(:mod:`affidavit.client.errors`). It imports neither the runtime nor the store: a program that
only talks to a server pays for httpx and pydantic, not for the engine.

    with affidavit.Client("http://127.0.0.1:8080", api_key=KEY) as client:
        job = client.submit("refund.yaml", {"order_id": "A-1001"}, idempotency_key="A-1001")
        job = client.wait(job.job_id, timeout=60)
"""

from __future__ import annotations

from affidavit.client._async import AsyncClient
from affidavit.client._sync import Client
from affidavit.client.errors import ApiError, ServerUnreachable

__all__ = ["ApiError", "AsyncClient", "Client", "ServerUnreachable"]
