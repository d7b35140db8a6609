"""What the client's tests share."""

from __future__ import annotations

from affidavit import Client
from tests.api.conftest import Api


def key(api: Api, who: str) -> str:
    """The raw API key (``afv_...``) of ``who``, as a user passes it to the client."""
    return api.keys[who].removeprefix("Bearer ")


def client(api: Api, who: str) -> Client:
    """A client of the test's server with ``who``'s key."""
    return Client(api.url, api_key=key(api, who))
