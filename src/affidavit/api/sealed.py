"""The trace, verification and pack of a sealed job, served from the server's
:class:`~affidavit.faces.sealed_cache.SealedCache` (docs/api.md, "Sealed jobs are served from
a cache").

Each request still authenticates, checks the job's namespace and reads the job's seal (one
snapshot): the answer kept is the one computed under *this* seal, for the inputs the request
gives. A job without a seal (running, or never sealed) is computed every time and never kept;
``fresh=1`` computes again whatever is kept, and keeps the new answer.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Response
from pydantic import BaseModel, TypeAdapter

from affidavit.core.canonical import canonical
from affidavit.core.errors import CanonicalizationError, JobNotFound
from affidavit.core.events import utc_now
from affidavit.core.seal import seal_sha256
from affidavit.faces.auth import Caller
from affidavit.faces.sealed_cache import CacheKey, SealedAnswer, SealedCache
from affidavit.store import Store, unmatchable

CACHED_HEADER = "X-Affidavit-Cached"
COMPUTED_AT_HEADER = "X-Affidavit-Computed-At"


def sealed_key(
    store: Store, caller: Caller, job_id: str, *, orphans: bool = False, keys: bool = False
) -> tuple[str, ...] | None:
    """Check that ``caller`` may see the job, and return what identifies its sealed record:
    the seal's hash (:func:`~affidavit.core.seal.seal_sha256`), with ``keys`` a digest of the
    public keys the database records (what a verification accepts); ``None`` for a job with no
    seal, a seal row that cannot be read, or a job with a data subject (an answer about it
    holds its values opened, which erasing the subject must take away: never kept).
    ``orphans``: a job id without a job row is no error for an admin (verification reports
    what is left of it), and gives ``None``.

    Raises:
        JobArchived: retention removed it (and the caller sees its namespace).
        JobNotFound: no such job, or not the caller's namespace.
    """
    if unmatchable(job_id):  # no job can have it
        raise JobNotFound(job_id)
    with store.snapshot(lenient_text=True) as snap:
        row = snap.job_row(job_id)
        if row is None:
            from affidavit.api.deps import raise_if_archived  # (deps holds the service)

            raise_if_archived(store, caller, job_id)
            if orphans and caller.has("admin"):
                return None
            raise JobNotFound(job_id)
        if not caller.sees(row["namespace"]):
            raise JobNotFound(job_id)
        try:
            seal = snap.seal_get(job_id)
        except ValueError:  # edited outside the store: the answer says so, every time
            return None
        if seal is None:
            return None
        recorded = snap.keys_list() if keys else []
    if store.job_key(job_id) is not None:  # a data subject's: what is kept must go with its key
        return None
    try:
        if not keys:
            return (seal_sha256(seal),)
        listed = sorted((k.to_dict() for k in recorded), key=lambda k: str(k["key_id"]))
        return (seal_sha256(seal), hashlib.sha256(canonical(listed)).hexdigest())
    except CanonicalizationError:  # text that is not Unicode (edited outside the store)
        return None


def source_seal_part(store: Store, job_id: str) -> str | None:
    """What a fork's cached verification also depends on: its source's seal as the store
    holds it now (a source re-sealed since must be reported, so it is part of the key);
    ``None``: not to be cached (a source seal that cannot be read)."""
    from affidavit.record import fork_lineage

    lineage = fork_lineage(store.list_events(job_id, limit=1))
    if lineage is None:
        return "no-fork"
    try:
        seal = store.get_seal(str(lineage["job_id"]))
        return "no-seal" if seal is None else seal_sha256(seal)
    except (ValueError, CanonicalizationError):  # (edited outside the store)
        return None


@functools.cache
def _adapter(model: type[BaseModel]) -> TypeAdapter[BaseModel]:
    return TypeAdapter(model)


def json_body(model: type[BaseModel], doc: Mapping[str, Any]) -> bytes:
    """``doc`` as the route's response model serializes it (unset fields left out): the bytes
    FastAPI writes for a route that returns ``doc``."""
    adapter = _adapter(model)
    return adapter.dump_json(adapter.validate_python(doc), exclude_unset=True)


def _json_response(answer: SealedAnswer, *, cached: bool) -> Response:
    # the kept body is a JSON object: its closing brace gives way to the two members
    tail = f',"cached":{"true" if cached else "false"},"computed_at":"{answer.computed_at}"}}'
    return Response(answer.body[:-1] + tail.encode(), media_type="application/json")


def serve_json(
    cache: SealedCache,
    key: CacheKey | None,
    model: type[BaseModel],
    compute: Callable[[], Mapping[str, Any]],
    *,
    fresh: bool,
) -> Response:
    """The answer kept under ``key`` (``cached: true``), or ``compute()`` now (``cached:
    false``), kept under ``key`` unless it is ``None``; ``fresh`` always computes. Either way
    the document names when it was computed (``computed_at``)."""
    if key is not None and not fresh:
        hit = cache.get(key)
        if hit is not None:
            return _json_response(hit, cached=True)
    computed_at = utc_now()
    answer = SealedAnswer(json_body(model, compute()), computed_at)
    if key is not None:
        cache.put(key, answer)
    return _json_response(answer, cached=False)


def serve_bytes(
    cache: SealedCache,
    key: CacheKey | None,
    media_type: str,
    compute: Callable[[], tuple[bytes, Mapping[str, str]]],
    *,
    fresh: bool,
) -> Response:
    """:func:`serve_json` for a body that is not JSON (a pack): whether it was kept and when
    it was computed are the headers ``X-Affidavit-Cached`` and ``X-Affidavit-Computed-At``."""
    answer = cache.get(key) if key is not None and not fresh else None
    cached = answer is not None
    if answer is None:
        computed_at = utc_now()
        body, headers = compute()
        answer = SealedAnswer(body, computed_at, tuple(headers.items()))
        if key is not None:
            cache.put(key, answer)
    headers = dict(answer.headers)
    headers[CACHED_HEADER] = "true" if cached else "false"
    headers[COMPUTED_AT_HEADER] = answer.computed_at
    return Response(answer.body, media_type=media_type, headers=headers)
