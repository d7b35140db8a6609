"""A monitor: an auditor that follows a log from its tiles without cosigning
(``affidavit log monitor``).

Its state directory holds ``monitor.json`` (the last checkpoint it verified: origin, size, root,
the note) and ``jobs.sqlite`` (the index of every job id it audited, store/audit_index.py).
One step (:meth:`Monitor.step`) reads the latest checkpoint, verifies the log's signature, its
consistency with the last one verified (the first is trusted as it is), and audits the new
entries as a witness does (tlog/_audit.py). It reports what it saw as records (one JSON line
each on the command line): a ``checkpoint`` record per checkpoint verified, and one per
problem: ``fork``, ``duplicate_job``, ``malformed_leaf``, ``entries_mismatch`` or
``bad_checkpoint``. A problem is reported again at every step until it is dealt with: the
monitor does not move past a checkpoint it could not verify (its state and index stay), and it
writes the evidence (``<kind>-<size>-<time>.json``) in its state directory.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from affidavit.core.checkpoint import Checkpoint, open_checkpoint
from affidavit.core.note import NoteError, Verifier
from affidavit.store.audit_index import INDEX_FILE, AuditStateError, JobIndex
from affidavit.tlog._audit import (
    Audit,
    EntriesMismatch,
    Progress,
    findings_evidence,
    inconsistency,
    write_evidence,
)
from affidavit.tlog._fetch import LogClient
from affidavit.tlog._witness import read_state, write_state

STATE_FILE = "monitor.json"
MONITOR_PROBLEMS = ("fork", "duplicate_job", "malformed_leaf", "entries_mismatch", "bad_checkpoint")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Monitor:
    """A monitor with its state in ``state_dir``, following the log at ``log_url``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        log_url: str,
        log_key: Verifier,
        timeout: float = 10.0,
        client: httpx.Client | None = None,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.state_dir = state_dir
        self.log_key = log_key
        self.log = LogClient(log_url, timeout=timeout, client=client)
        self.progress = progress
        self.should_stop = should_stop
        self._index: JobIndex | None = None

    def state(self) -> Checkpoint | None:
        """The last checkpoint this monitor verified (``None`` before the first)."""
        return read_state(self.state_dir / STATE_FILE)

    def step(self) -> list[dict[str, Any]]:
        """Read, verify and audit the latest checkpoint; the records of what it found.

        Raises:
            LogReadError: the log is unreachable or served malformed tiles or bundles.
            AuditStateError: the state directory is unusable or another log's.
            AuditInterrupted: ``should_stop`` said so in the middle of an audit.
        """
        text = self.log.checkpoint()
        try:
            new, note, _ = open_checkpoint(text, self.log_key)
        except NoteError as exc:
            reason = f"the log's checkpoint does not verify: {exc.message}"
            return [{"kind": "bad_checkpoint", "reason": reason, "checkpoint": text[:4096]}]
        old = self.state()
        if old is not None:
            if old.origin != new.origin:
                raise AuditStateError(
                    f"the state directory follows {old.origin!r}, not {new.origin!r}"
                )
            reason = inconsistency(self.log, old, new)
            if reason:
                return [self._fork(old, new, text, reason)]
        if self._index is None:
            self._index = JobIndex(self.state_dir / INDEX_FILE, new.origin)
        index = self._index
        if index.size > (old.size if old else 0):
            index.reset()  # it covers a state that is gone
        start = index.size
        audit = Audit(self.log, index, progress=self.progress, should_stop=self.should_stop)
        try:
            findings = audit.run(new)
        except EntriesMismatch as exc:
            return [_problem("entries_mismatch", new, exc.message)]
        if findings:
            doc = findings_evidence(new, text, findings)  # the signed note: evidence
            path = str(write_evidence(self.state_dir, findings[0].kind, doc))
            return [
                {**_problem(f.kind, new, f.reason), **f.to_dict(), "evidence": path}
                for f in findings
            ]
        write_state(self.state_dir / STATE_FILE, new, note.text, verified_at=int(time.time()))
        index.commit(new.size)
        return [
            {
                "kind": "checkpoint",
                "origin": new.origin,
                "size": new.size,
                "root": _b64(new.root),
                "previous_size": old.size if old else None,
                "new_entries": new.size - start,
            }
        ]

    def _fork(self, old: Checkpoint, new: Checkpoint, note: str, reason: str) -> dict[str, Any]:
        evidence = {
            "reason": reason,
            "size": old.size,
            "verified": {"origin": old.origin, "size": old.size, "root": _b64(old.root)},
            "offending_checkpoint": note,
        }
        path = write_evidence(self.state_dir, "fork", evidence)
        record = _problem("fork", new, reason)
        return {**record, "verified_size": old.size, "evidence": str(path)}

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
        self.log.close()


def _problem(kind: str, checkpoint: Checkpoint, reason: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "origin": checkpoint.origin,
        "size": checkpoint.size,
        "root": _b64(checkpoint.root),
        "reason": reason,
    }
