"""A real API server (uvicorn on a loopback port, in a thread) over a database of each backend,
shared by the tests of a module; keys of every role in two namespaces."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.api.app import create_app
from affidavit.faces.auth import create_api_key, revoke_api_key
from affidavit.faces.ratelimit import RateLimit
from affidavit.store import Store, open_store
from tests.conftest import BACKENDS, PG_URL, REQUIRE_PG, drop_schema, pg_available, with_schema


@pytest.fixture(scope="module", params=BACKENDS)
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('api') / 'affidavit.db'}"
        return
    if not pg_available():
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required but unreachable at {PG_URL}")
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield with_schema(PG_URL, schema)
    drop_schema(schema)


@pytest.fixture(scope="module", autouse=True)
def _module_signing_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One seal key for the module's database, as one host's, set before the module's server
    and runtime are made: the database accepts the key that sealed in it first, and refuses
    another (docs/verification.md)."""
    path = tmp_path_factory.mktemp("keys") / "affidavit-signing.key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AFFIDAVIT_SIGNING_KEY", str(path))
        yield


@pytest.fixture(autouse=True)
def _signing_key_in_tmp() -> None:
    """(Overrides tests/conftest.py's per-test key: the tests of a module share a database.)"""


class Server:
    """uvicorn serving ``app`` on 127.0.0.1 (an ephemeral port) in a background thread."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the API server did not start")
            threading.Event().wait(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _act(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return {"did": ctx.node_id, "args": args}


def _think(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return {"thought": args}


TRANSFERS: list[int] = []  # the amounts the approval-requiring tool moved, in this process


def _transfer(ctx: ToolContext, amount: int) -> dict[str, Any]:
    TRANSFERS.append(amount)
    return {"moved": amount}


TOOLS = ToolRegistry(
    [
        Tool("act", _act, "tool"),
        Tool("think", _think, "pure"),
        Tool("transfer", _transfer, "tool", requires_approval=lambda amount, **_: amount > 100),
    ]
)

WAITING_PLAN: dict[str, Any] = {
    "name": "api-test",
    "nodes": [
        {"id": "a", "type": "tool", "tool": "act", "args": {"x": "${input.x}"}},
        {"id": "ok", "type": "approval", "depends_on": ["a"]},
        {"id": "t", "type": "pure", "tool": "think", "args": {"a": "${a}", "ok": "${ok}"},
         "depends_on": ["ok"]},
    ],
}  # fmt: skip


@dataclass
class Api:
    """The server's URL, its store, a runtime over the same database, and keys by name."""

    url: str
    store: Store
    runtime: Runtime
    keys: dict[str, str]

    def client(self, who: str | None) -> httpx.Client:
        headers = {}
        if who is not None:
            headers["Authorization"] = self.keys.get(who, who)
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def waiting_job(self, namespace: str = "a") -> str:
        """A job in ``namespace`` waiting for the approval ``<job>:ok``."""
        job = self.runtime.submit(WAITING_PLAN, {"x": 1}, namespace=namespace)
        self.runtime.run_job(job.job_id)
        assert self.runtime.get_job(job.job_id).status == "waiting"
        return job.job_id


def make_keys(store: Store) -> dict[str, str]:
    keys = {}
    for name, agent, role, ns in [
        ("observer_a", "watcher-a", "observer", "a"),
        ("agent_a", "bot-a", "agent", "a"),
        ("agent_a2", "bot-a2", "agent", "a"),
        ("approver_a", "ann", "approver", "a"),
        ("approver_a2", "ben", "approver", "a"),
        ("approver_b", "bea", "approver", "b"),
        ("agent_b", "bot-b", "agent", "b"),
        ("admin", "root", "admin", "ops"),
        ("revoked", "old-bot", "agent", "a"),
    ]:
        row, key = create_api_key(store, agent_id=agent, role=role, namespace=ns)
        keys[name] = f"Bearer {key}"
        if name == "revoked":
            revoke_api_key(store, row.key_id)
    keys["bad"] = "Bearer afv_0000000000000000_" + "x" * 43
    keys["not_bearer"] = keys["agent_a"].replace("Bearer ", "Basic ")
    return keys


@pytest.fixture(scope="module")
def api(db_url: str) -> Iterator[Api]:
    store = open_store(db_url)
    keys = make_keys(store)
    app = create_app(store, tools=TOOLS, rate_limit=RateLimit(100_000, 1))
    with Server(app) as url, Runtime(db_url, tools=TOOLS) as rt:
        yield Api(url, store, rt, keys)
    store.close()


@pytest.fixture
def limited(db_url: str) -> Iterator[Api]:
    """A second server over the same database with a tiny rate limit (3 requests a minute)."""
    store = open_store(db_url)
    keys = make_keys(store)
    app = create_app(store, tools=TOOLS, rate_limit=RateLimit(3, 60))
    with Server(app) as url, Runtime(db_url, tools=TOOLS) as rt:
        yield Api(url, store, rt, keys)
    store.close()
