"""Each operation of the client as one request and how its answer is read, shared by
:class:`~affidavit.client.Client` and :class:`~affidavit.client.AsyncClient` (which only send
them, each with its own httpx client)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from affidavit.api.models import (
    Cancel,
    CancelResult,
    Decisions,
    Erasure,
    Event,
    EventPage,
    Job,
    JobList,
    Resume,
    Signal,
    SignalResult,
    SubjectDetail,
    SubjectList,
    SubmitJob,
    Trace,
    Verification,
)
from affidavit.client.errors import ApiError, ServerUnreachable
from affidavit.core.errors import (
    AffidavitError,
    ConfigError,
    StoreError,
    StoreUnavailable,
    WaitTimeout,
)
from affidavit.faces.ratelimit import RateLimited

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

API_KEY_ENV = "AFFIDAVIT_API_KEY"
# A job is settled when it will not move without someone: finished, or needing a person (the
# runtime's own wait, affidavit.Runtime.wait, stops at the same statuses).
SETTLED_STATUSES = ("completed", "failed", "cancelled", "waiting", "parked")
FIRST_POLL_SECONDS = 0.05
EVENTS_PAGE = 1000  # the API's largest page
_PLAN_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request (``path`` under the server's URL) and the reader of its answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: tuple[tuple[str, str | int], ...] = ()
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header of ``api_key`` (default ``$AFFIDAVIT_API_KEY``)."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if not key:
        raise ConfigError(
            "no API key: pass api_key=... or set AFFIDAVIT_API_KEY",
            hint="Create one on the server's host: `affidavit apikeys create --agent NAME "
            "--role agent --namespace NS` (it is printed once).",
        )
    return {"Authorization": f"Bearer {key.removeprefix('Bearer ').strip()}"}


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    """A reader of an answer that is a ``cls`` document."""

    def read(response: httpx.Response) -> M:
        try:
            return cls.model_validate(response.json())
        except (ValueError, pydantic.ValidationError) as exc:
            raise ApiError(
                f"the answer to {response.request.method} {response.request.url.path} is not "
                f"a {cls.__name__} document: {str(exc)[:300]}",
                status=response.status_code,
                code="unexpected_answer",
                hint="Is the server an affidavit of the same version as this client?",
            ) from None

    return read


def _text(response: httpx.Response) -> str:
    return response.text


def _job_path(job_id: str, tail: str = "") -> str:
    return f"/api/jobs/{quote(job_id, safe='')}{tail}"


def plan_or_agent_body(plan_or_agent: Any) -> dict[str, Any]:
    """``{"plan": ...}`` or ``{"agent": NAME}`` of what :meth:`Client.submit` was given: a plan
    (a mapping, an :class:`affidavit.Plan`, or the path of a ``.json``/``.yaml``/``.yml`` plan
    file, read here) or an agent (one of ``@affidavit.agent``, or its name: any other string)."""
    from affidavit.core.plan import Plan

    if isinstance(plan_or_agent, Mapping):
        return {"plan": dict(plan_or_agent)}
    if isinstance(plan_or_agent, str | Path) and (
        isinstance(plan_or_agent, Path) or plan_or_agent.lower().endswith(_PLAN_SUFFIXES)
    ):
        plan_or_agent = Plan.from_file(plan_or_agent)
    if isinstance(plan_or_agent, Plan):
        named = {} if plan_or_agent.name is None else {"name": plan_or_agent.name}
        return {"plan": {**named, **plan_or_agent.policy.to_dict(), **plan_or_agent.task_graph}}
    if isinstance(plan_or_agent, str):
        return {"agent": plan_or_agent}
    name = getattr(plan_or_agent, "name", None)
    if isinstance(name, str) and callable(getattr(plan_or_agent, "fn", None)):
        return {"agent": name}  # an @affidavit.agent (the server runs its own registered code)
    raise ConfigError(
        f"cannot submit a {type(plan_or_agent).__name__}",
        hint="Give a plan (a dict, an affidavit.Plan or a plan file's path) or an agent "
        "(@affidavit.agent, or its name).",
    )


def submit(
    plan_or_agent: Any,
    input: Any,
    *,
    queue: str | None,
    priority: int | None,
    partition_key: str | None,
    not_before: datetime | None,
    namespace: str | None,
    replay_verification: str | None,
    idempotency_key: str | None,
    traceparent: str | None,
    tags: Mapping[str, str] | None = None,
    subject: str | None = None,
) -> Call[Job]:
    fields = {
        "tags": None if tags is None else dict(tags),
        "subject": subject,
        "queue": queue,
        "priority": priority,
        "partition_key": partition_key,
        "not_before": not_before,
        "namespace": namespace,
        "replay_verification": replay_verification,
    }
    try:
        body = SubmitJob.model_validate(
            {**plan_or_agent_body(plan_or_agent), "input": input}
            | {k: v for k, v in fields.items() if v is not None}
        )
    except pydantic.ValidationError as exc:
        raise ConfigError(
            f"invalid submission: {exc}", hint="See docs/api.md, POST /api/jobs."
        ) from None
    headers = {}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    if traceparent is not None:
        headers["traceparent"] = traceparent
    return Call(
        "POST",
        "/api/jobs",
        model(Job),
        json=body.model_dump(mode="json", exclude_unset=True),
        headers=headers,
    )


def get(job_id: str) -> Call[Job]:
    return Call("GET", _job_path(job_id), model(Job))


def list_jobs(
    *,
    status: str | Sequence[str] | None,
    namespace: str | None,
    limit: int,
    offset: int,
    before: str | None,
    tag: Mapping[str, str] | Sequence[str] | str | None = None,
) -> Call[JobList]:
    params: list[tuple[str, str | int]] = [("limit", limit), ("offset", offset)]
    params += [("tag", t) for t in tag_texts(tag)]
    statuses = [status] if isinstance(status, str) else list(status or ())
    params += [("status", s) for s in statuses]
    if namespace is not None:
        params.append(("namespace", namespace))
    if before is not None:
        params.append(("before", before))
    return Call("GET", "/api/jobs", model(JobList), params=tuple(params))


def tag_texts(tag: Mapping[str, str] | Sequence[str] | str | None) -> list[str]:
    """``KEY=VALUE`` texts of a tag filter: a mapping (every pair must match), ``KEY=VALUE``
    texts, or one such text."""
    if tag is None:
        return []
    if isinstance(tag, str):
        return [tag]
    if isinstance(tag, Mapping):
        return [f"{k}={v}" for k, v in tag.items()]
    return list(tag)


def signal(job_id: str, key: str, payload: Any) -> Call[SignalResult]:
    body = Signal(key=key, payload=payload).model_dump(mode="json")
    return Call("POST", _job_path(job_id, "/signal"), model(SignalResult), json=body)


def decision(approved: bool, comment: str | None) -> dict[str, Any]:
    """An approval's decision payload: exactly ``{"approved": ...}`` with an optional
    ``comment``."""
    return {"approved": approved} | ({} if comment is None else {"comment": comment})


def resume(
    job_id: str, decision: str, *, result: Any, note: str | None, park_version: int | None
) -> Call[Job]:
    try:
        body = Resume.model_validate(
            {"decision": decision, "result": result, "note": note, "park_version": park_version}
        )
    except pydantic.ValidationError as exc:
        raise ConfigError(
            f"invalid resume: {exc}", hint="decision: retry, accept_result, continue or fail."
        ) from None
    json = body.model_dump(mode="json", exclude_none=True)
    return Call("POST", _job_path(job_id, "/resume"), model(Job), json=json)


def cancel(job_id: str, *, reason: str | None, force: bool) -> Call[CancelResult]:
    body = Cancel(reason=reason, force=force).model_dump(mode="json", exclude_none=True)
    return Call("POST", _job_path(job_id, "/cancel"), model(CancelResult), json=body)


def events_page(job_id: str, after_version: int) -> Call[EventPage]:
    params = (("after_version", after_version), ("limit", EVENTS_PAGE))
    return Call("GET", _job_path(job_id, "/events"), model(EventPage), params=params)


def trace(job_id: str) -> Call[Trace]:
    return Call("GET", _job_path(job_id, "/trace"), model(Trace))


def decisions(job_id: str) -> Call[Decisions]:
    return Call("GET", _job_path(job_id, "/decisions"), model(Decisions))


def verify(
    job_id: str, trusted_keys: Sequence[str] | None, *, fresh: bool = False
) -> Call[Verification]:
    params: tuple[tuple[str, str | int], ...] = tuple(
        ("trusted_key", k) for k in trusted_keys or ()
    )
    if fresh:
        params += (("fresh", 1),)
    return Call("GET", _job_path(job_id, "/verify"), model(Verification), params=params)


def stream_path(job_id: str) -> str:
    return _job_path(job_id, "/stream")


def stream_headers(after_version: int) -> dict[str, str]:
    """The headers of a (re)connection to a job's stream that has read up to
    ``after_version``: ``Last-Event-ID`` as an EventSource sends it, and SSE's media type."""
    headers = {"Accept": "text/event-stream"}
    if after_version:
        headers["Last-Event-ID"] = str(after_version)
    return headers


@dataclass(slots=True)
class SseReader:
    """Server-Sent Events from the lines of a stream, one :meth:`feed` a line: an event of the
    job's log comes back as the API's :class:`~affidavit.api.models.Event` once its frame is
    complete; ``ended`` is set by the server's ``end`` event (the job finished and every event
    was sent). Comments (heartbeats) and ``retry:`` are skipped. A frame larger than
    ``max_frame_chars`` is refused: the stream is not the API's."""

    max_frame_chars: int = 64 * 1024 * 1024
    ended: dict[str, Any] | None = None
    _event: str | None = None
    _data: list[str] = field(default_factory=list)
    _size: int = 0

    def feed(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        self._size += len(line)
        if self._size > self.max_frame_chars:
            raise ApiError(
                f"a stream frame is larger than {self.max_frame_chars} characters",
                status=200,
                code="unexpected_answer",
                hint="Is the server an affidavit of the same version as this client?",
            )
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> Event | None:
        kind, data = self._event, "\n".join(self._data)
        self._event, self._data, self._size = None, [], 0
        if not data:
            return None
        try:
            if kind == "end":
                self.ended = dict(Ended.model_validate_json(data).model_dump())
                return None
            return Event.model_validate_json(data)
        except pydantic.ValidationError as exc:
            raise ApiError(
                f"a stream frame is not an event: {str(exc)[:300]}",
                status=200,
                code="unexpected_answer",
                hint="Is the server an affidavit of the same version as this client?",
            ) from None


class Ended(pydantic.BaseModel):
    """The ``end`` event of a job's stream."""

    status: str
    version: int


class Reconnects:
    """When :meth:`Client.stream` reconnects: after the server closed the stream without its
    ``end`` (its time limit), at once; after a connection that failed, with a pause doubling
    from 50 ms up to 2 s, for up to ``retry_seconds`` without an event in between."""

    def __init__(self, retry_seconds: float) -> None:
        if retry_seconds < 0:
            raise ValueError("retry_seconds must not be negative")
        self.retry_seconds = retry_seconds
        self.failing_since: float | None = None
        self.next = FIRST_POLL_SECONDS

    def progressed(self) -> None:
        self.failing_since, self.next = None, FIRST_POLL_SECONDS

    def failed(self, exc: AffidavitError) -> float:
        """The pause before the next attempt; raises ``exc`` when the time is up."""
        now = time.monotonic()
        self.failing_since = self.failing_since if self.failing_since is not None else now
        if now - self.failing_since >= self.retry_seconds:
            raise exc
        pause, self.next = self.next, min(self.next * 2, 2.0)
        return pause


def _subject_path(subject: str, tail: str = "") -> str:
    # every character but the unreserved ones percent-encoded, `.` too: a subject `..` must
    # not become a dot segment that a URL normalizer removes (the server decodes it back)
    return f"/api/subjects/{quote(subject, safe='').replace('.', '%2E')}{tail}"


def subjects(*, limit: int, after: str | None) -> Call[SubjectList]:
    params: list[tuple[str, str | int]] = [("limit", limit)]
    if after is not None:
        params.append(("after", after))
    return Call("GET", "/api/subjects", model(SubjectList), params=tuple(params))


def subject(subject: str) -> Call[SubjectDetail]:
    return Call("GET", _subject_path(subject), model(SubjectDetail))


def erase(subject: str, reason: str | None) -> Call[Erasure]:
    # (sent as given: the server bounds the reason, and answers its own error)
    return Call("POST", _subject_path(subject, "/erase"), model(Erasure), json={"reason": reason})


def log_proof(job_id: str) -> Call[str]:
    return Call("GET", _job_path(job_id, "/log-proof"), _text)


def pack_path(job_id: str) -> str:
    return _job_path(job_id, "/pack")


def pack_destination(job_id: str, dest: str | Path) -> Path:
    """Where :meth:`Client.pack` writes: ``dest``, or ``pack-<job>.tar.gz`` inside it when it
    is a directory. It must not exist yet (a pack is never overwritten).

    Raises:
        ConfigError: the file exists already.
    """
    path = Path(dest)
    if path.is_dir():
        path = path / f"pack-{job_id}.tar.gz"
    if path.exists():
        raise ConfigError(
            f"{path} exists already", hint="Give a path that does not exist, or remove the file."
        )
    return path


def transient(exc: AffidavitError) -> float | None:
    """How long to pause before polling again after ``exc`` when it may pass on its own (the
    server away or restarting, its database unavailable, the key's rate limit), else
    ``None``."""
    if isinstance(exc, RateLimited):
        return exc.retry_after
    if isinstance(exc, ServerUnreachable | StoreUnavailable) or type(exc) is StoreError:
        return 0.0  # (the wait's own backoff)
    return None


def settled(job: Job) -> bool:
    """Whether ``job`` will not move without someone (see :data:`SETTLED_STATUSES`)."""
    return job.status in SETTLED_STATUSES


class Waiter:
    """The state of :meth:`Client.wait`: polls from 50 ms apart, doubling up to
    ``poll_seconds``; errors that may pass on their own (:func:`transient`) ridden out for up
    to ``retry_seconds`` in a row; :class:`~affidavit.core.errors.WaitTimeout` once
    ``timeout`` has passed with the job still pending or running.

    The client's loop: read the job, hand it to :meth:`seen` (or the error to :meth:`failed`),
    sleep :meth:`pause` seconds, again."""

    def __init__(self, timeout: float | None, poll_seconds: float, retry_seconds: float):
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must not be negative")
        if poll_seconds <= 0:
            raise ValueError("poll_seconds must be positive")
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.poll_seconds = poll_seconds
        self.retry_seconds = retry_seconds
        self.next = min(FIRST_POLL_SECONDS, poll_seconds)
        self.last: Job | None = None  # the job as last read
        self.failing: AffidavitError | None = None  # the error of the last read, if it failed
        self.failing_since: float | None = None
        self.extra = 0.0  # a pause the last error asked for (Retry-After)

    def seen(self, job: Job) -> bool:
        """Whether the wait is over: ``job`` is settled."""
        self.last, self.failing, self.failing_since, self.extra = job, None, None, 0.0
        return settled(job)

    def failed(self, exc: AffidavitError) -> None:
        """Note a read that failed; raises ``exc`` unless it may pass and there is time."""
        pause = transient(exc)
        now = time.monotonic()
        self.failing_since = self.failing_since if self.failing_since is not None else now
        if pause is None or now - self.failing_since >= self.retry_seconds:
            raise exc
        self.failing, self.extra = exc, pause

    def pause(self) -> float:
        """The pause before the next read. Raises WaitTimeout (with the job as last read)
        when the time is up, or the last error when the job could never be read."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            if self.last is None:
                assert self.failing is not None  # (a read that succeeded set ``last``)
                raise self.failing
            raise WaitTimeout(self.last, self.timeout or 0.0)
        pause = max(self.next, self.extra)
        self.next = min(self.next * 2, self.poll_seconds)
        return pause if left is None else min(pause, left)
