"""``Client.stream`` and ``AsyncClient.stream`` against a real server on loopback, on both
backends: a running job's values arrive while it runs, the iterator ends with the job, every
event once and in order — also across the reconnections the server's time limit forces."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from affidavit import AsyncClient, Client, JobNotFound, Runtime
from affidavit.api.app import create_app
from affidavit.faces.limits import StreamSlots
from affidavit.faces.ratelimit import RateLimit
from affidavit.store import open_store
from tests.api import stream_tools
from tests.api.conftest import Api, Server, make_keys
from tests.client.helpers import key


class CountingTransport(httpx.HTTPTransport):
    """The network transport, counting the stream requests it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stream"):
            self.streams += 1
        return super().handle_request(request)


@pytest.fixture(scope="module")
def short(db_url: str) -> Iterator[Api]:
    """A server whose streams stay open 0.3 s at most: a reader must reconnect to follow a
    job that runs longer."""
    store = open_store(db_url)
    keys = make_keys(store)
    slots = StreamSlots(max_connections=4, max_seconds=0.3, heartbeat_seconds=0.1)
    app = create_app(store, rate_limit=RateLimit(100_000, 1), stream_slots=slots)
    with Server(app) as url, Runtime(db_url, tools=stream_tools.TOOLS) as rt:
        yield Api(url, store, rt, keys)
    store.close()


def start_gated(api: Api) -> tuple[str, threading.Thread]:
    job_id = api.runtime.submit("gated_agent", {}, namespace="a").job_id
    stream_tools.GATES[job_id] = threading.Event()
    runner = threading.Thread(target=api.runtime.run_job, args=(job_id,), daemon=True)
    runner.start()
    return job_id, runner


def open_gate_after(job_id: str, transport: CountingTransport, streams: int) -> None:
    """Open the job's gate once the client has connected ``streams`` times (in a thread)."""

    def wait() -> None:
        deadline = time.monotonic() + 60
        while transport.streams < streams and time.monotonic() < deadline:
            time.sleep(0.02)
        stream_tools.GATES[job_id].set()

    threading.Thread(target=wait, daemon=True).start()


def test_stream_follows_a_job_across_reconnections(short: Api) -> None:
    job_id, runner = start_gated(short)
    transport = CountingTransport()
    values = []
    with Client(short.url, api_key=key(short, "observer_a"), transport=transport) as c:
        events = []
        for event in c.stream(job_id):
            events.append(event)
            if event.type == "stream_emitted":
                values.append(event.payload["value"])
                if event.payload["value"] == {"held": True}:
                    assert short.store.get_job(job_id).status == "running"
                    open_gate_after(job_id, transport, transport.streams + 2)
        runner.join(30)
        assert transport.streams >= 3  # the server closed the stream; the client came back
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        assert values == ["first", {"held": True}, "second"]
        assert events[-1].type == "job_completed"
        stored = short.store.list_events(job_id)
        assert [e.chain_hash for e in events] == [e.chain_hash for e in stored]
        # resumed from a version: only the later events, and it ends at once (finished job)
        rest = list(c.stream(job_id, after_version=len(events) - 2))
        assert [e.version for e in rest] == [len(events) - 1, len(events)]
        with pytest.raises(JobNotFound):
            list(c.stream("no-such-job"))


def test_async_stream(short: Api) -> None:
    job_id, runner = start_gated(short)

    async def go() -> list[int]:
        seen = []
        async with AsyncClient(short.url, api_key=key(short, "observer_a")) as c:
            async for event in c.stream(job_id):
                seen.append(event.version)
                if event.type == "stream_emitted" and event.payload["value"] == {"held": True}:
                    stream_tools.GATES[job_id].set()
        return seen

    versions = asyncio.run(go())
    runner.join(30)
    assert versions == list(range(1, len(short.store.list_events(job_id)) + 1))
