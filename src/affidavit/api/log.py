"""The transparency log over HTTP: C2SP tlog-tiles (``/log/checkpoint``, ``/log/tile/...``,
``/log/tile/entries/...``) for standard tooling and witnesses, a consistency proof as JSON,
witnesses' cosignatures handed back, and a job's tlog-proof.

The tlog-tiles resources need no key: they are the public face of the log (its leaves name job
ids, seal lengths and chain heads — never events). Handing back a cosignature needs an admin
key; a job's proof needs a key of the job's namespace.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, Field

from affidavit.api.deps import Admin, Observer, ServiceDep, check_visible
from affidavit.api.models import ErrorBody
from affidavit.tlog import TransparencyLog, parse_tile_path

router = APIRouter(
    tags=["transparency log"],
    responses={code: {"model": ErrorBody} for code in (400, 404, 503)},
)
# Tree sizes are 64-bit (C2SP tlog-checkpoint); anything larger is refused before it is used.
_MAX_SIZE = 2**63 - 1

_TEXT = "text/plain; charset=utf-8"
_IMMUTABLE = {"Cache-Control": "public, max-age=31536000, immutable"}


class Consistency(BaseModel):
    old_size: int
    new_size: int
    proof: list[str] = Field(description="base64 hashes, RFC 9162 order")


class CosignatureIn(BaseModel):
    checkpoint: str = Field(max_length=16384, description="The cosigned checkpoint note.")
    witness_vkey: str = Field(max_length=512, description="The witness's cosigner vkey.")


@router.get("/log/checkpoint", response_class=Response)
def checkpoint(svc: ServiceDep) -> Response:
    """The latest checkpoint (a C2SP signed note) with the witness cosignatures stored for
    it."""
    note = TransparencyLog(svc.store).checkpoint()
    return Response(note, media_type=_TEXT, headers={"Cache-Control": "no-cache, max-age=1"})


@router.get("/log/checkpoint/{size}", response_class=Response)
def checkpoint_at(size: Annotated[int, Path(ge=0, le=_MAX_SIZE)], svc: ServiceDep) -> Response:
    """The checkpoint the log signed at ``size`` (with its cosignatures)."""
    return Response(TransparencyLog(svc.store).checkpoint(size), media_type=_TEXT)


@router.get("/log/tile/{path:path}", response_class=Response)
def tile(path: str, svc: ServiceDep) -> Response:
    """A hash tile ``<L>/<N>[.p/<W>]`` or an entry bundle ``entries/<N>[.p/<W>]``
    (c2sp.org/tlog-tiles); 404 when it does not exist at that width."""
    data = TransparencyLog(svc.store).tile(parse_tile_path(path))
    return Response(data, media_type="application/octet-stream", headers=_IMMUTABLE)


@router.get("/log/consistency", response_model=Consistency)
def consistency(
    svc: ServiceDep,
    old: Annotated[int, Query(ge=1, le=_MAX_SIZE)],
    new: Annotated[int, Query(ge=1, le=_MAX_SIZE)],
) -> dict[str, Any]:
    """The consistency proof from tree size ``old`` to ``new`` (what a witness checks)."""
    hashes = TransparencyLog(svc.store).consistency(old, new)
    return {
        "old_size": old,
        "new_size": new,
        "proof": [base64.b64encode(h).decode() for h in hashes],
    }


@router.post("/log/cosignatures", responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})
def add_cosignature(body: CosignatureIn, svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """Store a witness's cosignature of one of this log's checkpoints; it is served with that
    checkpoint from then on and travels in the proofs against it."""
    added = TransparencyLog(svc.store).add_cosignature(body.checkpoint, body.witness_vkey)
    return {"added": added}


@router.get(
    "/api/jobs/{job_id}/log-proof",
    response_class=Response,
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
)
def job_log_proof(job_id: str, svc: ServiceDep, caller: Observer) -> Response:
    """The job's ``c2sp.org/tlog-proof@v1``; 404 for an unknown job, one of another namespace,
    or one not in the log yet."""
    check_visible(svc.store, caller, job_id)
    return Response(TransparencyLog(svc.store).job_proof(job_id).encode(), media_type=_TEXT)
