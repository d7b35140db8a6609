"""``GET /api/jobs/{id}/stream`` over real HTTP (uvicorn on loopback), on both backends: a value
emitted by a running job reaches the reader while the job still runs; a reader that comes back
with ``Last-Event-ID`` gets only what came after; the stream ends with the job; a quiet stream
has heartbeats; the server's stream slots, the namespaces and the header are enforced."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from affidavit import Runtime, verify_job
from affidavit.api.app import create_app
from affidavit.faces.limits import StreamSlots
from affidavit.faces.ratelimit import RateLimit
from affidavit.store import open_store
from tests.api import stream_tools
from tests.api.conftest import Api, Server, make_keys


@dataclass
class Frame:
    id: int | None
    event: str | None
    data: Any
    comment: str | None = None


def frames(response: httpx.Response) -> Iterator[Frame]:
    """The Server-Sent Events of ``response`` as they arrive (comments as frames too)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield Frame(None, None, None, comment=line[1:].strip())
        elif line == "":
            if "data" in fields or "event" in fields:
                yield Frame(
                    int(fields["id"]) if "id" in fields else None,
                    fields.get("event"),
                    json.loads(fields["data"]) if "data" in fields else None,
                )
            fields = {}
        else:
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


@pytest.fixture(scope="module")
def sapi(db_url: str) -> Iterator[Api]:
    store = open_store(db_url)
    keys = make_keys(store)
    slots = StreamSlots(max_connections=2, max_seconds=60, heartbeat_seconds=0.2)
    app = create_app(store, rate_limit=RateLimit(100_000, 1), stream_slots=slots)
    with Server(app) as url, Runtime(db_url, tools=stream_tools.TOOLS) as rt:
        yield Api(url, store, rt, keys)
    store.close()


def start_gated(api: Api, namespace: str = "a") -> tuple[str, threading.Thread]:
    job_id = api.runtime.submit("gated_agent", {}, namespace=namespace).job_id
    stream_tools.GATES[job_id] = threading.Event()
    runner = threading.Thread(target=api.runtime.run_job, args=(job_id,), daemon=True)
    runner.start()
    return job_id, runner


def test_a_value_arrives_while_the_job_runs_and_the_stream_ends_with_it(sapi: Api) -> None:
    job_id, runner = start_gated(sapi)
    seen: list[Frame] = []
    with (
        sapi.client("observer_a") as c,
        c.stream("GET", f"/api/jobs/{job_id}/stream") as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for frame in frames(r):
            seen.append(frame)
            if frame.event == "stream_emitted" and frame.data["payload"]["value"] == {"held": True}:
                # the job is still inside its step: the reader has the values already
                assert sapi.store.get_job(job_id).status == "running"
                stream_tools.GATES[job_id].set()
            if frame.event == "end":
                break
    runner.join(30)
    events = [f for f in seen if f.id is not None]
    assert [f.id for f in events] == list(range(1, len(events) + 1))  # every event, in order
    assert [f.event for f in events][:2] == ["job_created", "agent_started"]
    values = [f.data["payload"]["value"] for f in events if f.event == "stream_emitted"]
    assert values == ["first", {"held": True}, "second"]
    assert seen[-1].data == {"status": "completed", "version": events[-1].id}
    assert events[-1].event == "job_completed"
    assert verify_job(sapi.store, job_id).ok


def test_last_event_id_resumes_after_it(sapi: Api) -> None:
    job_id, runner = start_gated(sapi)
    with sapi.client("observer_a") as c:
        with c.stream("GET", f"/api/jobs/{job_id}/stream") as r:
            for frame in frames(r):
                if frame.event == "stream_emitted" and frame.data["payload"]["value"] == "first":
                    first = frame.id
                    break  # the reader goes away mid-job
        assert first is not None
        stream_tools.GATES[job_id].set()
        runner.join(30)
        with c.stream(
            "GET", f"/api/jobs/{job_id}/stream", headers={"Last-Event-ID": str(first)}
        ) as r:
            later = [f for f in frames(r) if f.id is not None or f.event == "end"]
    ids = [f.id for f in later if f.id is not None]
    assert ids[0] == first + 1 and ids == list(range(first + 1, first + 1 + len(ids)))
    values = [f.data["payload"]["value"] for f in later if f.event == "stream_emitted"]
    assert values == [{"held": True}, "second"]  # not "first" again
    assert later[-1].event == "end" and later[-1].data["status"] == "completed"
    # the query parameter does the same; the header wins over it
    with sapi.client("observer_a") as c:
        with c.stream("GET", f"/api/jobs/{job_id}/stream?after_version={ids[-1]}") as r:
            rest = [f for f in frames(r) if f.id is not None or f.event == "end"]
        assert [f.event for f in rest] == ["end"]
        header = {"Last-Event-ID": str(ids[-1])}
        with c.stream("GET", f"/api/jobs/{job_id}/stream?after_version=0", headers=header) as r:
            rest = [f for f in frames(r) if f.id is not None or f.event == "end"]
        assert [f.event for f in rest] == ["end"]


def test_a_quiet_stream_gets_heartbeats_and_slots_are_bounded(sapi: Api) -> None:
    job_id, runner = start_gated(sapi)
    with sapi.client("observer_a") as c, c.stream("GET", f"/api/jobs/{job_id}/stream") as r:
        got_value = False
        read = frames(r)  # (kept: a generator dropped mid-way closes the connection)
        for frame in read:
            got_value = got_value or frame.event == "stream_emitted"
            if got_value and frame.comment == "heartbeat":
                break  # the job holds in its step: nothing to send but a heartbeat
        with sapi.client("observer_a") as c2, c2.stream("GET", f"/api/jobs/{job_id}/stream"):
            busy = c.get(f"/api/jobs/{job_id}/stream")  # the third stream: no slot left
        assert busy.status_code == 503
        assert busy.json()["error"]["code"] == "streams_busy"
        stream_tools.GATES[job_id].set()
        assert any(f.event == "end" for f in read)
    runner.join(30)


def test_stream_reads_are_guarded(sapi: Api) -> None:
    job_id, runner = start_gated(sapi, namespace="b")
    stream_tools.GATES[job_id].set()
    runner.join(30)
    with sapi.client("observer_a") as c:
        assert c.get(f"/api/jobs/{job_id}/stream").status_code == 404  # another namespace
        bad = c.get(f"/api/jobs/{job_id}/stream", headers={"Last-Event-ID": "x1"})
        assert bad.status_code == 422 and "Last-Event-ID" in bad.json()["error"]["message"]
        assert c.get("/api/jobs/nope/stream").status_code == 404
    with sapi.client(None) as anonymous:
        assert anonymous.get(f"/api/jobs/{job_id}/stream").status_code == 401
    with sapi.client("agent_b") as c, c.stream("GET", f"/api/jobs/{job_id}/stream") as r:
        assert [f.event for f in frames(r)][-1] == "end"  # finished: everything, then the end
