"""The transparency-log phase of ``affidavit pack verify --log-key K [--witness-key W ...]``.

A pack exported from a job that is in the log carries the job's ``c2sp.org/tlog-proof@v1`` as
``log.tlog-proof`` (outside the signed manifest: the proof authenticates itself with the log's
and the witnesses' signatures, and is bound to the pack by its leaf, which must be the leaf of
the seal the pack's signed ``affidavit.seal/v0`` receipt holds). Verifiers that do not know it
(assay) ignore the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from affidavit.core.seal import Seal, log_leaf
from affidavit.packs import _format as F
from affidavit.packs._state import State

if TYPE_CHECKING:
    from affidavit.core.note import Verifier

TLOG_PROOF = "log.tlog-proof"
MAX_PROOF_BYTES = 256 * 1024


def check_log_proof(
    st: State,
    log_key: Verifier,
    witnesses: Sequence[Verifier],
    min_witnesses: int | None,
    log_url: str | None = None,
) -> dict[str, Any]:
    """Check the pack's tlog-proof against its seal (and, with ``log_url``, that its leaf is
    the job's first in the checkpointed tree); errors go to ``st.errors``."""
    seals = [r for r, kind in zip(st.receipts, st.kinds, strict=True) if kind == F.SEAL]
    path = st.root / TLOG_PROOF
    if len(seals) != 1 or not isinstance(seals[0].get("seal"), dict):
        st.errors.append(f"{TLOG_PROOF}: the pack has no job seal to check it against")
        return {"present": path.is_file(), "ok": False}
    try:
        leaf = log_leaf(Seal.from_dict(seals[0]["seal"]))
    except (ValueError, TypeError) as exc:
        st.errors.append(f"{TLOG_PROOF}: the pack's seal is malformed: {exc}")
        return {"present": path.is_file(), "ok": False}
    if path.is_symlink() or not path.is_file():
        st.errors.append(f"{TLOG_PROOF}: the pack carries no transparency-log proof")
        return {"present": False, "ok": False}
    if path.stat().st_size > MAX_PROOF_BYTES:
        st.errors.append(f"{TLOG_PROOF}: larger than {MAX_PROOF_BYTES} bytes")
        return {"present": True, "ok": False}
    from affidavit.tlog import HttpEntries, check_proof  # (only with a log key: not at start-up)

    entries = HttpEntries(log_url) if log_url else None
    try:
        result = check_proof(
            path.read_bytes(), log_key, witnesses, min_witnesses=min_witnesses,
            expected_leaf=leaf, entries=entries,
        )  # fmt: skip
    finally:
        if entries is not None:
            entries.close()
    st.errors.extend(f"{TLOG_PROOF}: {e}" for e in result.errors)
    return {"present": True, **result.to_dict()}
