"""The seal check: required once the job is terminal, signed by an accepted key, covering
exactly the recomputed length, chain root and (v2) events root."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.seal import PublicKey, Seal, check_signature, events_root
from affidavit.verify._fold import LogFold
from affidavit.verify._keys import unknown_key_error
from affidavit.verify._parts import SealCheck


def check_seal(
    fold: LogFold, seal: Seal | None, keys: dict[str, PublicKey], terminal: bool, status: str
) -> SealCheck:
    if seal is None:
        if terminal:
            return SealCheck(False, False, error=f"the job is {status} but has no seal")
        return SealCheck(False, True)
    error = ""
    key = keys.get(seal.key_id)
    if seal.job_id != fold.job_id:
        error = f"the seal is for job {seal.job_id!r}"
    elif key is None:
        error = unknown_key_error(keys, seal.key_id)
    else:
        try:
            error = check_signature(seal, key.public_key)
        except AffidavitError as exc:  # a field the signed message cannot hold
            error = f"the seal cannot be checked: {exc.message}"
    if not error and seal.event_count != fold.count:
        error = f"the seal covers {seal.event_count} events, the log has {fold.count}"
    if not error and seal.event_chain_root_hash != fold.root:
        error = "the seal's chain root does not match the log (re-chained or altered)"
    if not error and seal.version >= 2 and seal.events_root != events_root(fold.heads):
        error = "the seal's events_root does not match the log's events (v2 seal altered)"
    if not error and not terminal:
        error = "a seal on a job that is not terminal"
    return SealCheck(True, not error, seal.key_id, seal.event_count, error)


def parse_seal(seal: Seal | Mapping[str, Any] | None) -> Seal | None:
    if seal is None or isinstance(seal, Seal):
        return seal
    try:
        return Seal.from_dict(seal)
    except ValueError as exc:
        raise VerificationError(f"malformed seal: {exc}") from None
