"""``affidavit.Client``: a served affidavit (``affidavit serve``) over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from affidavit.api.models import (
    CancelResult,
    Decisions,
    Erasure,
    Event,
    Job,
    JobList,
    SignalResult,
    SubjectDetail,
    SubjectList,
    Trace,
    Verification,
)
from affidavit.client import _calls as calls
from affidavit.client.errors import error_from, unreachable
from affidavit.core.errors import AffidavitError

T = TypeVar("T")
DEFAULT_TIMEOUT = 30.0


class Client:
    """The HTTP API of the affidavit at ``url`` with ``api_key`` (default
    ``$AFFIDAVIT_API_KEY``), as a Python object: every method is one route of docs/api.md,
    returns the API's own model (:mod:`affidavit.api.models`) and raises the
    :class:`~affidavit.AffidavitError` the server answered with (see
    :mod:`affidavit.client.errors`) or :class:`~affidavit.client.ServerUnreachable`.

    What a key may do is its role's (observer < agent < admin; approver decides approvals):
    the server decides. ``timeout``: seconds per request (httpx's). ``transport``: an httpx
    transport to send through (default: the network). Use it as a context manager, or
    :meth:`close` it.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers=calls.auth_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _run(self, call: calls.Call[T]) -> T:
        try:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.json, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise unreachable(self.url + call.path, exc) from exc
        if response.is_error:
            raise error_from(response)
        return call.read(response)

    # --- jobs ----------------------------------------------------------------------------------

    def submit(
        self,
        plan_or_agent: Any,
        input: Any = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        partition_key: str | None = None,
        not_before: datetime | None = None,
        namespace: str | None = None,
        replay_verification: str | None = None,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        tags: Mapping[str, str] | None = None,
        subject: str | None = None,
    ) -> Job:
        """Enqueue a job (``POST /api/jobs``; nothing runs here: a worker claims it).
        ``plan_or_agent``: a plan (a dict, an :class:`affidavit.Plan`, or a ``.json``/
        ``.yaml``/``.yml`` file's path, read here) or an agent registered in the server's
        ``--tools`` (its name, or the ``@affidavit.agent`` object). The same
        ``idempotency_key`` returns the same job. ``queue``, ``priority``, ``partition_key``,
        ``not_before``: docs/queues.md; ``namespace``: admins only. ``tags``: up to 16
        ``key → value`` texts to list the job by (plain text, never encrypted: no personal
        data).
        ``subject`` (agent jobs): the person the job's data is about; its values are stored
        sealed under the subject's key, erasable with ``affidavit erase`` (docs/privacy.md).

        Raises:
            PlanError: the plan file cannot be read or is not a plan.
            ConfigError: ``plan_or_agent`` is neither, or a field is malformed.
            IdempotencyConflict: the key names a job with another plan or input.
            ApiError: the server refused it otherwise (an invalid plan or input, an unknown
                agent or queue: 422), nothing written.
        """
        return self._run(
            calls.submit(
                plan_or_agent,
                input,
                queue=queue,
                priority=priority,
                partition_key=partition_key,
                not_before=not_before,
                namespace=namespace,
                replay_verification=replay_verification,
                idempotency_key=idempotency_key,
                traceparent=traceparent,
                tags=tags,
                subject=subject,
            )
        )

    def get(self, job_id: str) -> Job:
        """The job. Raises JobNotFound (also for another namespace's job)."""
        return self._run(calls.get(job_id))

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        poll_seconds: float = 1.0,
        retry_seconds: float = 60.0,
    ) -> Job:
        """Poll the job until it is finished (``completed``, ``failed``, ``cancelled``) or
        needs a person (``waiting`` for a signal or approval, ``parked``), and return it. Polls
        start 50 ms apart and double up to ``poll_seconds``. The server away, its database
        unavailable or the key's rate limit are ridden out for up to ``retry_seconds`` in a
        row.

        Raises:
            JobNotFound: no such job.
            WaitTimeout: still pending or running after ``timeout`` seconds (its ``job`` is
                the job as last read).
            ServerUnreachable, StoreUnavailable: for longer than ``retry_seconds``.
        """
        waiter = calls.Waiter(timeout, poll_seconds, retry_seconds)
        while True:
            try:
                if waiter.seen(self.get(job_id)):
                    assert waiter.last is not None
                    return waiter.last
            except AffidavitError as exc:
                waiter.failed(exc)
            time.sleep(waiter.pause())

    def trace(self, job_id: str) -> Trace:
        """Each node or agent step with its state, the waits and the park."""
        return self._run(calls.trace(job_id))

    def decisions(self, job_id: str) -> Decisions:
        """What a person is asked to decide about the job, and what this key may decide."""
        return self._run(calls.decisions(job_id))

    def events(self, job_id: str, *, after_version: int = 0) -> list[Event]:
        """The job's events after ``after_version``, in version order, each with its chain
        hash (every page of ``/events``)."""
        found: list[Event] = []
        while True:
            page = self._run(calls.events_page(job_id, after_version))
            found += page.events
            if page.next_after_version is None:
                return found
            after_version = page.next_after_version

    def stream(
        self, job_id: str, *, after_version: int = 0, retry_seconds: float = 60.0
    ) -> Iterator[Event]:
        """The job's events as they are recorded (``GET /api/jobs/{id}/stream``, Server-Sent
        Events), after ``after_version``, in version order, each once; the iterator ends when
        the job has finished and every event was read. It resumes on its own: when the server
        closes the stream (its time limit) or the connection fails, it reconnects with
        ``Last-Event-ID`` (a failing server is tried for up to ``retry_seconds`` without an
        event in between).

        Raises:
            JobNotFound: no such job (also another namespace's).
            StreamsBusy: (as ApiError) the server has as many streams open as it allows.
            ServerUnreachable: for longer than ``retry_seconds``.
        """
        last = after_version
        retry = calls.Reconnects(retry_seconds)
        url = calls.stream_path(job_id)
        while True:
            reader = calls.SseReader()
            try:
                with self._http.stream("GET", url, headers=calls.stream_headers(last)) as r:
                    if r.is_error:
                        r.read()
                        raise error_from(r)
                    for line in r.iter_lines():
                        event = reader.feed(line)
                        if event is not None and event.version > last:
                            last = event.version
                            retry.progressed()
                            yield event
                        if reader.ended is not None:
                            return
            except httpx.TransportError as exc:
                time.sleep(retry.failed(unreachable(self.url + url, exc)))

    # --- what a person decides ---------------------------------------------------------------

    def signal(self, job_id: str, key: str, payload: Any = None) -> SignalResult:
        """Complete the wait whose correlation key is ``key`` with ``payload`` (role agent or
        above). A repeated key writes nothing (``appended`` is false).

        Raises:
            SignalRejected: no wait of the job has this key, or the job ended.
            Forbidden: the key's role may not signal.
        """
        return self._run(calls.signal(job_id, key, payload))

    def approve(self, job_id: str, key: str, comment: str | None = None) -> SignalResult:
        """Approve the approval ``key`` (a key of role approver or admin, not the submitter's);
        the decision is recorded with the key's agent id, role and key id.

        Raises:
            ApprovalRefused: this key may not decide it.
            SignalRejected: no open approval has this key.
        """
        return self._run(calls.signal(job_id, key, calls.decision(True, comment)))

    def deny(self, job_id: str, key: str, comment: str | None = None) -> SignalResult:
        """Deny the approval ``key`` (see :meth:`approve`): the node fails ``not_approved``."""
        return self._run(calls.signal(job_id, key, calls.decision(False, comment)))

    def resume(
        self,
        job_id: str,
        decision: str,
        *,
        result: Any = None,
        note: str | None = None,
        park_version: int | None = None,
    ) -> Job:
        """Resolve a parked job (admin): ``retry``, ``accept_result`` (with ``result``),
        ``continue`` or ``fail``; with ``park_version``, only that park. Raises ApiError
        (``invalid_state``, 409) for a job not parked (by that park), nothing written."""
        return self._run(
            calls.resume(job_id, decision, result=result, note=note, park_version=park_version)
        )

    def cancel(
        self, job_id: str, *, reason: str | None = None, force: bool = False
    ) -> CancelResult:
        """Cancel a job that has not finished (admin); with a tool call in flight the job ends
        cancelled once the call's outcome is recorded, unless ``force`` (docs/runtime.md)."""
        return self._run(calls.cancel(job_id, reason=reason, force=force))

    # --- data subjects (admin keys; docs/privacy.md) --------------------------------------------

    def subjects(self, *, limit: int = 1000, after: str | None = None) -> SubjectList:
        """The data subjects, oldest first, a page of at most ``limit`` (up to 10,000) after
        the subject id ``after`` (a page's ``next_after``): each one's id (a keyed hash),
        jobs count, first and last use, erasure — never the subject nor its jobs' values
        (admin keys only)."""
        return self._run(calls.subjects(limit=limit, after=after))

    def subject(self, subject: str) -> SubjectDetail:
        """One subject (as given to :meth:`submit`) with its job ids (admin keys only).

        Raises:
            SubjectNotFound: no job was ever submitted for it.
            SubjectError: a malformed subject.
        """
        return self._run(calls.subject(subject))

    def erase(self, subject: str, reason: str | None = None) -> Erasure:
        """Erase ``subject`` (admin keys only): its data key is destroyed, every proof still
        verifies; returns the signed receipt (``receipt``: write it as JSON for ``affidavit
        erase verify FILE --key KEY``). Erasing again returns the same receipt with
        ``erased_now`` false.

        Raises:
            SubjectBusy: a job of the subject is not finished (nothing changed).
            SubjectNotFound: no job was ever submitted for it.
            SubjectError: a malformed subject or reason.
        """
        return self._run(calls.erase(subject, reason))

    # --- the record ----------------------------------------------------------------------------

    def verify(
        self, job_id: str, *, trusted_keys: Sequence[str] | None = None, fresh: bool = False
    ) -> Verification:
        """Verification Mode on the server (any status; ``ok`` is the verdict): the proofs,
        the stored chain and the seal, against ``trusted_keys`` if given (base64 public keys
        or recorded key ids). A sealed job's result is computed once by the server and served
        again (``cached``, ``computed_at``); ``fresh`` verifies the database as it is now. To
        trust no server, verify a :meth:`pack` offline."""
        return self._run(calls.verify(job_id, trusted_keys, fresh=fresh))

    def pack(self, job_id: str, dest: str | Path) -> Path:
        """Write the finished job's signed proof pack (a ``.tar.gz``; ``affidavit pack
        verify`` checks it offline) to ``dest``, or into it as ``pack-<job>.tar.gz`` when it
        is a directory, and return the path. A file is never overwritten.

        Raises:
            ConfigError: the file exists.
            ApiError: the job has not finished (``job_not_finished``) or does not verify
                (``pack_error``), 409.
        """
        path = calls.pack_destination(job_id, dest)
        url = calls.pack_path(job_id)
        try:
            with self._http.stream("GET", url) as response:
                if response.is_error:
                    response.read()
                    raise error_from(response)
                with path.open("xb") as out:
                    try:
                        for chunk in response.iter_bytes():
                            out.write(chunk)
                    except BaseException:
                        path.unlink()
                        raise
        except httpx.TransportError as exc:
            raise unreachable(self.url + url, exc) from exc
        return path

    def log_proof(self, job_id: str) -> str:
        """The job's ``c2sp.org/tlog-proof@v1`` (``affidavit log verify`` checks it offline).
        Raises ApiError (``not_in_log``, 404) before the job's seal is in the log."""
        return self._run(calls.log_proof(job_id))

    def list(
        self,
        *,
        status: str | Sequence[str] | None = None,
        namespace: str | None = None,
        limit: int = 50,
        offset: int = 0,
        before: str | None = None,
        tag: Mapping[str, str] | Sequence[str] | str | None = None,
    ) -> JobList:
        """A page of jobs, newest first: the key's namespace (an admin's: all, or
        ``namespace``), of any of ``status``; a full page names the next one's ``before``
        (``next_before``). ``tag``: only jobs with these tags (a mapping, or ``KEY=VALUE``
        texts; every one must match)."""
        return self._run(
            calls.list_jobs(
                status=status,
                namespace=namespace,
                limit=limit,
                offset=offset,
                before=before,
                tag=tag,
            )
        )
