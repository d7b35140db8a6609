"""A witness: a separate process with its own key that follows a log over HTTP and cosigns
each checkpoint that extends the last one it cosigned (C2SP tlog-cosignature, Ed25519 type
0x04) and whose new entries pass its audit.

Its state directory holds its key (``witness.key``, mode 0600), ``state.json`` (the last
checkpoint it cosigned: origin, size, root, the note) and ``jobs.sqlite`` (the index of every
job id in the leaves it audited, store/audit_index.py). One step (:meth:`Witness.step`):

1. fetch ``<log>/log/checkpoint`` and verify the log's signature with the pinned log vkey;
2. against the state: a smaller size, or the same size with another root, is a fork; a larger
   size needs ``<log>/log/consistency?old=&new=`` to verify (RFC 9162) — else a fork;
   with no state yet the first checkpoint is trusted as it is;
3. audit the new entries (tlog/_audit.py): read them and the tiles they need, check they hash
   to the checkpoint's root, and refuse a leaf that repeats a job id seen before (in an earlier
   cosigned tree or earlier in the batch) or that is malformed; an index that covers less than
   the state (an upgrade, or a crash between (4) and (5)) is caught up from where it stops;
4. write the new state durably (fsync, rename); 5. commit the audited job ids to the index;
   only then cosign;
6. hand the cosigned note back to the log (``POST /log/cosignatures``, with an admin key)
   so that it travels in proofs; a witness killed before (6) hands the same cosignature back
   at its next step, when the log serves that checkpoint without it.

A fork or a failed audit is refused: nothing is cosigned, the state and the index are kept, and
the evidence is written to the state directory: ``fork-<size>-<time>.json`` (the cosigned
checkpoint, the offending one, the reason), ``duplicate_job-<size>-<time>.json`` or
``malformed_leaf-<size>-<time>.json`` (the signed checkpoint; per finding the leaf's index and
bytes, the job id, and the earlier leaf's index and bytes).
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from affidavit.core.checkpoint import Checkpoint, open_checkpoint
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.note import COSIGNATURE_V1, Note, NoteError, NoteSigner, Verifier
from affidavit.core.signing import SigningKey
from affidavit.store.audit_index import INDEX_FILE, JobIndex
from affidavit.tlog._audit import (
    Audit,
    Finding,
    ForkDetected,
    findings_evidence,
    inconsistency,
    write_atomic,
    write_evidence,
)
from affidavit.tlog._fetch import MAX_RESPONSE_BYTES, MAX_SMALL_ANSWER, LogClient, LogReadError

KEY_FILE = "witness.key"
STATE_FILE = "state.json"
__all__ = ["MAX_RESPONSE_BYTES", "ForkDetected", "StepResult", "Witness", "WitnessError"]


class WitnessError(AffidavitError):
    """The witness cannot do its step (bad answer, bad state)."""

    code = "witness_error"
    default_hint = "Check --log-url, the log's vkey and the state directory."


class DuplicateJob(VerificationError):
    """A new entry repeats a job id already in the log: the witness refuses to cosign."""

    code = "duplicate_job"
    default_hint = (
        "The log holds two leaves for one job: a job was rewritten and re-sealed. Keep the "
        "evidence file in the state directory and tell whoever relies on this log."
    )


class MalformedLeaf(VerificationError):
    """A new entry is not a leaf of this log's format: the witness refuses to cosign."""

    code = "malformed_leaf"
    default_hint = "Keep the evidence file in the state directory and tell the log's operator."


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one witness step did."""

    cosigned: bool
    size: int
    origin: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "cosigned": self.cosigned,
            "size": self.size,
            "origin": self.origin,
            "reason": self.reason,
        }


def read_state(path: Path) -> Checkpoint | None:
    """The checkpoint recorded in a state file (``None`` when there is none).

    Raises:
        WitnessError: the file is unreadable.
    """
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        return Checkpoint(doc["origin"], int(doc["size"]), base64.b64decode(doc["root"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WitnessError(f"the state {str(path)!r} is unreadable: {exc}") from exc


def write_state(path: Path, checkpoint: Checkpoint, note: str, **extra: Any) -> None:
    doc = {
        "origin": checkpoint.origin,
        "size": checkpoint.size,
        "root": base64.b64encode(checkpoint.root).decode(),
        "checkpoint": note,
        **extra,
    }
    write_atomic(path, json.dumps(doc).encode())


class Witness:
    """A witness named ``name`` with its state in ``state_dir``, following one log."""

    def __init__(
        self,
        state_dir: Path,
        name: str,
        *,
        log_url: str,
        log_key: Verifier,
        api_key: str | None = None,
        timeout: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.log_url = log_url.rstrip("/")
        self.log_key = log_key
        self.api_key = api_key
        self.signer = NoteSigner(name, self.key(state_dir).private, COSIGNATURE_V1)
        self.log = LogClient(self.log_url, timeout=timeout, client=client)
        self._index: JobIndex | None = None

    @staticmethod
    def key(state_dir: Path) -> SigningKey:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return SigningKey.load_or_create(state_dir / KEY_FILE)

    @property
    def verifier(self) -> Verifier:
        return self.signer.verifier

    def state(self) -> Checkpoint | None:
        """The last checkpoint this witness cosigned (``None`` before the first).

        Raises:
            WitnessError: the state file is unreadable.
        """
        return read_state(self.state_dir / STATE_FILE)

    def index(self, origin: str) -> JobIndex:
        if self._index is None:
            self._index = JobIndex(self.state_dir / INDEX_FILE, origin)
        return self._index

    def step(self) -> StepResult:
        """Fetch, check, audit and cosign the log's latest checkpoint.

        Raises:
            ForkDetected: the checkpoint is inconsistent with the last one cosigned (the
                evidence file is written first).
            DuplicateJob, MalformedLeaf: a new entry failed the audit (evidence written).
            EntriesMismatch: the entries served do not hash to the signed root.
            LogReadError: the log is unreachable or answers nonsense.
            WitnessError: bad state or checkpoint.
        """
        text = self.log.checkpoint()
        try:  # (1)
            new, note, _ = open_checkpoint(text, self.log_key)
        except NoteError as exc:
            raise WitnessError(f"the log's checkpoint does not verify: {exc.message}") from exc
        old = self.state()
        if old is not None:  # (2)
            if old.origin != new.origin:
                raise WitnessError(f"the log's origin changed from {old.origin!r}")
            reason = inconsistency(self.log, old, new)
            if reason:
                self._record_fork(old, text, reason)
                raise ForkDetected(
                    f"fork: the log's checkpoint at size {new.size} is inconsistent with the "
                    f"one cosigned at size {old.size}: {reason}"
                )
        index = self.index(new.origin)
        if index.size > (old.size if old else 0):
            index.reset()  # it covers a state that is gone
        if old is not None and old.size == new.size:
            if index.size < new.size:  # catch the index up (an upgrade, or after a crash)
                self._audit(new, text, cosigned=True)
                index.commit(new.size)
            mine = any(self.verifier.matches(sig) for sig in note.signatures)
            if not mine and self._hand_back_again(note):  # killed after (5), before (6)
                return StepResult(False, new.size, new.origin, "already cosigned; handed back")
            return StepResult(False, new.size, new.origin, "already cosigned")
        self._audit(new, text, cosigned=False)  # (3)
        now = int(time.time())
        write_state(self.state_dir / STATE_FILE, new, note.text, cosigned_at=now)  # (4)
        index.commit(new.size)  # (5)
        self._hand_back(note, now)  # (6)
        return StepResult(True, new.size, new.origin)

    def _hand_back_again(self, note: Note) -> bool:
        """The cosignature of the state's checkpoint made again — the same bytes: Ed25519 is
        deterministic and the timestamp is the one recorded — and handed back; ``False`` when
        the state does not record it (nothing handed back)."""
        try:
            doc = json.loads((self.state_dir / STATE_FILE).read_text())
            at = int(doc["cosigned_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if doc.get("checkpoint") != note.text:
            return False
        self._hand_back(note, at)
        return True

    def _audit(self, checkpoint: Checkpoint, signed: str, *, cosigned: bool) -> None:
        """Audit the new entries; refuse with the evidence (the signed note ``signed``)."""
        findings = Audit(self.log, self.index(checkpoint.origin)).run(checkpoint)
        if not findings:
            return
        doc = findings_evidence(checkpoint, signed, findings)
        path = write_evidence(self.state_dir, findings[0].kind, doc)
        raise _refusal(findings, checkpoint.size, path, cosigned=cosigned)

    def _record_fork(self, old: Checkpoint, offending: str, reason: str) -> None:
        evidence = {
            "reason": reason,
            "size": old.size,
            "cosigned": {
                "origin": old.origin,
                "size": old.size,
                "root": base64.b64encode(old.root).decode(),
            },
            "offending_checkpoint": offending,
        }
        write_evidence(self.state_dir, "fork", evidence)

    def _hand_back(self, note: Note, timestamp: int) -> None:
        signature = self.signer.sign(note.text, timestamp=timestamp)
        cosigned = Note(note.text, (*note.signatures, signature)).encode()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"checkpoint": cosigned, "witness_vkey": self.verifier.vkey()}
        try:
            status, answer = self.log.request(
                "POST", "/log/cosignatures", cap=MAX_SMALL_ANSWER, json=body, headers=headers
            )
        except LogReadError as exc:
            raise WitnessError(f"cannot hand the cosignature back to the log: {exc}") from exc
        if status != 200:
            text = answer[:200].decode("utf-8", "replace")
            raise WitnessError(f"the log refused the cosignature: HTTP {status} {text}")

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
        self.log.close()


def _refusal(
    findings: list[Finding], size: int, evidence: Path, *, cosigned: bool
) -> VerificationError:
    first = findings[0]
    what = (
        f"the checkpoint at size {size}, already cosigned before this audit, fails it"
        if cosigned
        else f"refused to cosign the checkpoint at size {size}"
    )
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    cls = DuplicateJob if first.kind == DuplicateJob.code else MalformedLeaf
    return cls(f"{what}: {first.reason}{more}; evidence in {evidence}")
