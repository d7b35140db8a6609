"""``GET /api/jobs/{id}/stream``: a job's log as Server-Sent Events while it runs — every event
as it is recorded (its ``stream_emitted`` values among them), ``id:`` its version, so that a
reader that reconnects with ``Last-Event-ID`` gets only what came after.

Bounded by the server's :class:`~affidavit.faces.limits.StreamSlots`: so many streams at once
(503 beyond), each open so long (then it closes and the reader reconnects where it was), a
heartbeat comment now and then so that proxies keep a quiet stream open. The reader is the
record's :class:`~affidavit.record.JobFollower` (the one ``affidavit jobs watch`` uses).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

import orjson
from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from affidavit.api.deps import Observer, ServiceDep, visible_job
from affidavit.api.models import ErrorBody
from affidavit.core.errors import ConfigError
from affidavit.faces.limits import StreamSlots
from affidavit.record import JobFollower, next_wait
from affidavit.store import Store, StoredEvent

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
MAX_INT = 2**53


def _frame(event: StoredEvent) -> bytes:
    data = orjson.dumps(event.to_dict())
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.version, event.type.encode(), data)


async def _frames(
    store: Store, job_id: str, after: int, limits: StreamSlots
) -> AsyncIterator[bytes]:
    follower = JobFollower(store, job_id, after, until_settled=False)
    end = time.monotonic() + limits.max_seconds
    beat = time.monotonic() + limits.heartbeat_seconds
    wait = next_wait(1.0, True)
    yield b"retry: 1000\n\n"
    while True:
        events = await run_in_threadpool(follower.poll)
        for event in events:
            yield _frame(event)
        if follower.status is not None:
            status = orjson.dumps({"status": follower.status, "version": follower.version})
            yield b"event: end\ndata: %s\n\n" % status
            return
        now = time.monotonic()
        if now >= end:
            return  # the reader reconnects with Last-Event-ID
        if events:
            beat = now + limits.heartbeat_seconds
        elif now >= beat:
            yield b": heartbeat\n\n"
            beat = now + limits.heartbeat_seconds
        wait = next_wait(wait, bool(events))
        await asyncio.sleep(wait)


class _Held:
    """The frames of a stream holding its slot, given back when the stream ends however it
    ends — its last frame, an error, the reader gone (a cancellation), or never started at all
    (the response dropped before its body: then when it is collected)."""

    def __init__(self, frames: AsyncIterator[bytes], slots: StreamSlots) -> None:
        self._frames = frames
        self._slots: StreamSlots | None = slots

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._frames)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.give_back()

    def __del__(self) -> None:
        self._release()


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"},
        **{code: {"model": ErrorBody} for code in (401, 403, 404, 422, 429, 503)},
    },
)
def stream(
    job_id: str,
    svc: ServiceDep,
    caller: Observer,
    after_version: Annotated[
        int, Query(ge=0, le=MAX_INT, description="Only events after this version.")
    ] = 0,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            description="The last version read (a reconnecting EventSource sends it): only "
            "later events. Wins over `after_version`.",
        ),
    ] = None,
) -> StreamingResponse:
    """The job's events as Server-Sent Events, as they are recorded: `id:` is the event's
    version, `event:` its type (`stream_emitted` for a value of `ctx.emit`), `data:` the event
    as `/events` gives it. When the job has finished (completed, failed, cancelled) and every
    event was sent, an `end` event (`{"status", "version"}`) closes the stream. A stream stays
    open at most the server's limit, then closes (reconnect with `Last-Event-ID`); a quiet one
    gets a `: heartbeat` comment now and then. 404 for an unknown job or one of another
    namespace; 422 for a `Last-Event-ID` that is not a version; 503 when the server has as
    many streams open as it allows."""
    after = after_version
    if last_event_id is not None:
        text = last_event_id.strip()
        if not text.isdigit() or len(text) > 16 or int(text) > MAX_INT:
            raise ConfigError(
                f"Last-Event-ID {last_event_id[:40]!r} is not an event version",
                hint="Send the id: of the last event read, a version ≥ 0.",
            )
        after = int(text)
    visible_job(svc.store, caller, job_id)
    svc.streams.take()
    return StreamingResponse(
        _Held(_frames(svc.store, job_id, after, svc.streams), svc.streams),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
