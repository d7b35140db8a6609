"""``/api/keys``: the public keys that check job seals (the same list `affidavit keys show`
prints), so that a verifier can pin the signer without access to the database."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from affidavit.api.deps import Observer, ServiceDep
from affidavit.api.models import ErrorBody, SealKeys

router = APIRouter(
    prefix="/api/keys",
    tags=["keys"],
    responses={code: {"model": ErrorBody} for code in (401, 429, 503)},
)


@router.get("", response_model=SealKeys)
def seal_keys(svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """Every recorded seal-verification key, retired ones included (they still verify the
    seals they signed). Private keys are never stored or served."""
    return {"keys": [k.to_dict() for k in svc.store.signing_keys()]}
