"""A witness: a separate process with its own key that follows a log over HTTP and cosigns
each checkpoint that extends the last one it cosigned (C2SP tlog-cosignature, Ed25519 type
0x04).

Its state directory holds its key (``witness.key``, mode 0600) and ``state.json`` (the last
checkpoint it cosigned: origin, size, root, the note). One step (:meth:`Witness.step`):

1. fetch ``<log>/log/checkpoint`` and verify the log's signature with the pinned log vkey;
2. against the state: a smaller size, or the same size with another root, is a fork; a larger
   size needs ``<log>/log/consistency?old=&new=`` to verify (RFC 9162) — else a fork;
   with no state yet the first checkpoint is trusted as it is;
3. write the new state durably (fsync, rename) — only then cosign;
4. hand the cosigned note back to the log (``POST /log/cosignatures``, with an admin key)
   so that it travels in proofs.

A fork is refused: nothing is cosigned, the state is kept, and the evidence (the cosigned
checkpoint, the offending one, the reason) is written to ``fork-<size>-<time>.json`` in the
state directory.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from affidavit.core.checkpoint import Checkpoint, open_checkpoint
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.merkle import ProofError, verify_consistency
from affidavit.core.note import COSIGNATURE_V1, Note, NoteError, NoteSigner, Verifier
from affidavit.runtime import SigningKey

KEY_FILE = "witness.key"
STATE_FILE = "state.json"
MAX_RESPONSE_BYTES = 1 << 20


class WitnessError(AffidavitError):
    """The witness cannot do its step (log unreachable, bad answer, bad state)."""

    code = "witness_error"
    default_hint = "Check --log-url, the log's vkey and the state directory."


class ForkDetected(VerificationError):
    """The log showed a checkpoint inconsistent with one this witness cosigned."""

    code = "fork_detected"
    default_hint = (
        "The log's history was rewritten: the witness refuses to cosign. Keep the evidence file "
        "and tell whoever relies on this log."
    )


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
        self._client = client or httpx.Client(timeout=timeout)

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
        path = self.state_dir / STATE_FILE
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            return Checkpoint(doc["origin"], int(doc["size"]), base64.b64decode(doc["root"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WitnessError(f"the witness state {str(path)!r} is unreadable: {exc}") from exc

    def _get(self, path: str, **params: int) -> httpx.Response:
        try:
            response = self._client.get(self.log_url + path, params=params or None)
        except httpx.HTTPError as exc:
            raise WitnessError(f"cannot reach the log at {self.log_url}: {exc}") from exc
        if response.status_code != 200 or len(response.content) > MAX_RESPONSE_BYTES:
            raise WitnessError(f"GET {path}: HTTP {response.status_code} from the log")
        return response

    def step(self) -> StepResult:
        """Fetch, check and cosign the log's latest checkpoint.

        Raises:
            ForkDetected: the checkpoint is inconsistent with the last one cosigned (the
                evidence file is written first).
            WitnessError: the log is unreachable or answers nonsense.
        """
        text = self._get("/log/checkpoint").text
        try:  # (1)
            new, note, _ = open_checkpoint(text, self.log_key)
        except NoteError as exc:
            raise WitnessError(f"the log's checkpoint does not verify: {exc.message}") from exc
        old = self.state()
        if old is not None:  # (2)
            if old.origin != new.origin:
                raise WitnessError(f"the log's origin changed from {old.origin!r}")
            reason = self._inconsistency(old, new)
            if reason:
                self._record_fork(old, text, reason)
                raise ForkDetected(
                    f"fork: the log's checkpoint at size {new.size} is inconsistent with the "
                    f"one cosigned at size {old.size}: {reason}"
                )
            if old.size == new.size:
                return StepResult(False, new.size, new.origin, "already cosigned")
        now = int(time.time())
        state = {
            "origin": new.origin,
            "size": new.size,
            "root": base64.b64encode(new.root).decode(),
            "checkpoint": note.text,
            "cosigned_at": now,
        }
        _write_atomic(self.state_dir / STATE_FILE, json.dumps(state).encode())  # (3)
        signature = self.signer.sign(note.text, timestamp=now)
        cosigned = Note(note.text, (*note.signatures, signature)).encode()
        self._hand_back(cosigned)  # (4)
        return StepResult(True, new.size, new.origin)

    def _inconsistency(self, old: Checkpoint, new: Checkpoint) -> str:
        if new.size < old.size:
            return f"the tree shrank from {old.size} to {new.size}"
        if new.size == old.size:
            return "" if new.root == old.root else f"two roots for size {new.size}"
        doc = self._get("/log/consistency", old=old.size, new=new.size).json()
        try:
            proof = [base64.b64decode(h, validate=True) for h in doc["proof"]]
            verify_consistency(old.size, new.size, proof, old.root, new.root)
        except ProofError as exc:
            return f"the consistency proof does not verify ({exc.message})"
        except (KeyError, TypeError, ValueError):
            return "the log answered no consistency proof"
        return ""

    def _record_fork(self, old: Checkpoint, offending: str, reason: str) -> None:
        evidence = {
            "detected_at": int(time.time()),
            "reason": reason,
            "cosigned": {
                "origin": old.origin,
                "size": old.size,
                "root": base64.b64encode(old.root).decode(),
            },
            "offending_checkpoint": offending,
        }
        name = f"fork-{old.size}-{time.time_ns()}.json"
        _write_atomic(self.state_dir / name, json.dumps(evidence, indent=2).encode())

    def _hand_back(self, cosigned: str) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = self._client.post(
                self.log_url + "/log/cosignatures",
                json={"checkpoint": cosigned, "witness_vkey": self.verifier.vkey()},
                headers=headers,
            )
        except httpx.HTTPError as exc:
            raise WitnessError(f"cannot hand the cosignature back to the log: {exc}") from exc
        if response.status_code != 200:
            raise WitnessError(
                f"the log refused the cosignature: HTTP {response.status_code} "
                f"{response.text[:200]}"
            )

    def close(self) -> None:
        self._client.close()
