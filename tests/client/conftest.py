"""The client's tests run against the API tests' server: uvicorn on a loopback port in a
thread, over a database of each backend, with keys of every role (tests/api/conftest.py)."""

from __future__ import annotations

from tests.api.conftest import (  # noqa: F401  (the fixtures this directory's tests use)
    _module_signing_key,
    _signing_key_in_tmp,
    api,
    db_url,
    limited,
)
