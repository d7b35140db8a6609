"""Selective disclosure: one step of a sealed job, provable offline without the rest of the job.

A v2 seal signs ``events_root``, the RFC 6962 root of the tree whose leaf i-1 is the raw chain
hash H_i of event i (see :func:`affidavit.core.seal.events_root`). A disclosure carries, for
each event it shows, the event itself, H_{i-1} and the inclusion proof of H_i; the verifier
recomputes H_i by the chain rule (FORMATS §4) and folds the proof up to the signed root. The
chain hashes of the other events are SHA-256 outputs over their whole content (a fresh event id
included), so the proof's sibling hashes reveal nothing one could guess from.

The file (``affidavit.disclosure/v1``, JCS)::

    {"type": "affidavit.disclosure/v1", "job_id", "selector",
     "seal": <Seal.to_dict of a v2 seal>,
     "events": [{"version", "event_id", "type", "payload", "previous_chain_hash", "proof"}],
     "tlog_proof": <c2sp.org/tlog-proof@v1 text> | null}

``selector`` says what is disclosed: decimal digits select the one event with that version
(``--event N``); anything else every step event (:data:`STEP_EVENT_TYPES`) whose payload's
``node_id`` or ``step_id`` equals it (``--step S``; an agent step's number, ``--step 3``, is
recorded as its node id ``#3``). Hashes are lowercase hex; ``previous_chain_hash`` is ``""`` for
version 1; ``proof`` is the inclusion proof, leaf sibling first.

What verification proves: the seal was signed by the given key; each shown event, exactly as
shown, is at its version in the sealed log of ``event_count`` events; with a log key, the seal
is the one the transparency log holds for the job (a job rewritten and re-sealed after it was
logged fails there). It does not prove that the step has no other events than those shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.canonical import canonical, canonical_of_parsed, loads_unique
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.errors import (
    AffidavitError,
    ConfigError,
    JobNotFound,
    NotFound,
    VerificationError,
)
from affidavit.core.merkle import MemoryTree, ProofError, leaf_hash, verify_inclusion
from affidavit.core.note import Verifier
from affidavit.core.seal import Seal, check_signature, key_id_for, log_leaf
from affidavit.store import Store, StoredEvent
from affidavit.tlog._entries import EntrySource, HttpEntries
from affidavit.tlog._log import LogError, TransparencyLog
from affidavit.tlog._verify import check_proof

DISCLOSURE_TYPE = "affidavit.disclosure/v1"
MAX_DISCLOSURE_BYTES = 16 * 1024 * 1024
MAX_EVENTS = 1000
MAX_PROOF_HASHES = 64
MAX_SELECTOR_CHARS = 256
# the events that belong to one step (job-level events that name a node are not the step's)
STEP_EVENT_TYPES = frozenset(
    {
        "step_called",
        "node_started",
        "tool_invocation_started",
        "tool_invocation_finished",
        "command_committed",
        "state_changed",
        "node_finished",
        "job_waiting",
        "wait_completed",
        "confirmation_warning",
        "step_compensated",
    }
)
_FIELDS = {"type", "job_id", "selector", "seal", "events", "tlog_proof"}
_EVENT_FIELDS = {"version", "event_id", "type", "payload", "previous_chain_hash", "proof"}
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class NotDisclosable(AffidavitError):
    """The job cannot be disclosed from: it has no seal, or a v1 seal (no events root)."""

    code = "not_disclosable"


class StepNotFound(NotFound):
    code = "step_not_found"
    default_hint = (
        "Give a plan node id, an agent step's number (3 or #3) or step id, or an event's "
        "version (`--event N`; see `affidavit jobs events JOB`)."
    )


# --- making a disclosure ------------------------------------------------------------------------


def is_version_selector(selector: str) -> bool:
    return selector.isascii() and selector.isdigit()


def selects(selector: str, event_type: str, payload: Any, version: int) -> bool:
    """Whether the event belongs to what ``selector`` names (see the module docs)."""
    if is_version_selector(selector):
        return version == int(selector)
    if event_type not in STEP_EVENT_TYPES or not isinstance(payload, dict):
        return False
    return selector in (payload.get("node_id"), payload.get("step_id"))


def disclose(
    store: Store,
    job_id: str,
    selector: str | None = None,
    *,
    step: str | None = None,
    event: int | None = None,
) -> dict[str, Any]:
    """The disclosure document of the events ``selector`` names in job ``job_id`` (the file's
    selector: see the module docs) — or, given instead, of the step ``step`` (a plan node id,
    a step id, an agent step's ``#SEQ`` or, for an agent job, its sequence number alone:
    ``"3"`` is step ``#3``), or of the event of version ``event``.

    Raises:
        JobNotFound: no such job.
        NotDisclosable: the job has no seal, or a v1 seal.
        StepNotFound: nothing in the job matches, or ``step`` is a number for a plan job (its
            events are ``event``'s).
        ConfigError: not exactly one of ``selector``, ``step`` and ``event`` is given, or
            ``event`` is no version (an integer ≥ 1).
        VerificationError: the stored log does not match its seal (it was altered).
    """
    if sum(x is not None for x in (selector, step, event)) != 1:
        raise ConfigError("give exactly one of --step and --event", hint=_WHAT)
    if event is not None and (type(event) is not int or event < 1):
        raise ConfigError(f"--event must be an event's version (≥ 1), not {event!r}", hint=_WHAT)
    given = selector if selector is not None else step
    if given is not None and (not given or len(given) > MAX_SELECTOR_CHARS):
        raise StepNotFound(f"--step must be 1 to {MAX_SELECTOR_CHARS} characters")
    with store.snapshot() as snap:
        if snap.get_job(job_id) is None:
            raise JobNotFound(job_id)
        seal = snap.seal_get(job_id)
        events = list(snap.iter_events(job_id))
    if seal is None:
        raise NotDisclosable(
            f"job {job_id} is not sealed (it has not finished), so there is nothing to disclose "
            "against",
            hint="Disclose from a completed, failed or cancelled job.",
        )
    if seal.version < 2 or seal.events_root is None:
        raise NotDisclosable(
            f"job {job_id} has a v1 seal, which signs no events root: its steps cannot be "
            "disclosed one by one",
            hint="Jobs sealed by this version (seal v2) can be; share this job whole, as a "
            "proof pack (`affidavit pack export`).",
        )
    if event is not None:
        selector = str(event)
    elif step is not None:
        selector = _step_selector(job_id, events, step)
    assert selector is not None
    return build_disclosure(seal, events, selector, _tlog_proof(store, job_id))


_WHAT = (
    "--step S: a plan node id, an agent step's number (3 or #3) or a step id; --event N: the "
    "event of version N (see `affidavit jobs events JOB`)."
)


def _step_selector(job_id: str, events: Sequence[StoredEvent], step: str) -> str:
    """The file's selector for the step ``step`` of the job whose log is ``events``: an agent
    job's sequence number as its node id (``3`` → ``#3``); a plan job's step as given, never a
    number (a number selects an event's version, which ``--event`` names).

    Raises:
        StepNotFound: ``step`` is a number and the job a plan job.
    """
    if not is_version_selector(step):
        return step
    first = events[0].payload if events and events[0].type == "job_created" else None
    if isinstance(first, dict) and first.get("kind") == "agent":
        return f"#{int(step)}"
    raise StepNotFound(
        f"job {job_id} is a plan job: --step {step} names no step (its steps are its node ids)",
        hint=f"For the event with version {step}, pass --event {step}. " + _WHAT,
    )


def build_disclosure(
    seal: Seal, events: Sequence[StoredEvent], selector: str, tlog_proof: str | None
) -> dict[str, Any]:
    """The disclosure document of the events ``selector`` names among ``events`` (the job's
    whole log, in version order), sealed by the v2 ``seal``.

    Raises:
        StepNotFound: nothing matches ``selector``, or too much does.
        VerificationError: the log does not match the seal, or a chosen event its chain hash.
    """
    job_id = seal.job_id
    altered = VerificationError(
        f"job {job_id}'s stored log does not match its seal's events root",
        hint=f"Run `affidavit verify {job_id}` to see what was altered.",
    )
    if [e.version for e in events] != list(range(1, len(events) + 1)):
        raise altered
    try:
        hashes = [bytes.fromhex(e.chain_hash) for e in events]
    except ValueError:
        raise altered from None
    tree = MemoryTree()
    tree.append(hashes)
    if len(events) != seal.event_count or tree.root().hex() != seal.events_root:
        raise altered
    chosen = [e for e in events if selects(selector, e.type, e.payload, e.version)]
    if not chosen:
        raise StepNotFound(f"job {job_id} has no step or event {selector!r}")
    if len(chosen) > MAX_EVENTS:
        raise StepNotFound(f"{selector!r} selects {len(chosen)} events (at most {MAX_EVENTS})")
    for e in chosen:
        previous = hashes[e.version - 2] if e.version > 1 else GENESIS
        if chain_next(previous, e.event_id, e.type, e.payload_bytes) != hashes[e.version - 1]:
            raise VerificationError(
                f"job {job_id}'s event {e.version} does not match its chain hash",
                hint=f"Run `affidavit verify {job_id}` to see what was altered.",
            )
    return {
        "type": DISCLOSURE_TYPE,
        "job_id": job_id,
        "selector": selector,
        "seal": seal.to_dict(),
        "events": [_disclosed(e, hashes, tree) for e in chosen],
        "tlog_proof": tlog_proof,
    }


def _disclosed(event: StoredEvent, hashes: Sequence[bytes], tree: MemoryTree) -> dict[str, Any]:
    i = event.version
    return {
        "version": i,
        "event_id": event.event_id,
        "type": event.type,
        "payload": event.payload,
        "previous_chain_hash": hashes[i - 2].hex() if i > 1 else "",
        "proof": [h.hex() for h in tree.inclusion_proof(i - 1)],
    }


def _tlog_proof(store: Store, job_id: str) -> str | None:
    """The job's tlog-proof text, or ``None`` while its seal is not in the log."""
    try:
        return TransparencyLog(store).job_proof(job_id).encode()
    except (LogError, NotFound):
        return None


def encode_disclosure(document: dict[str, Any]) -> bytes:
    """The file's bytes: JCS of the document and a newline."""
    return canonical(document) + b"\n"


# --- verifying one ------------------------------------------------------------------------------


@dataclass
class DisclosureCheck:
    """The verdict on a disclosure file: what it proves, or the first check that failed."""

    error: str = ""
    job_id: str | None = None
    selector: str | None = None
    seal: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    log: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.error

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "job_id": self.job_id,
            "selector": self.selector,
            "seal": self.seal,
            "events": self.events,
            "log": self.log,
        }


def verify_disclosure(
    data: bytes,
    seal_keys: Iterable[bytes],
    *,
    log_key: Verifier | None = None,
    witnesses: Sequence[Verifier] = (),
    min_witnesses: int | None = None,
    log_url: str | None = None,
) -> DisclosureCheck:
    """Verify a disclosure file offline against the seal verifier keys (raw 32-byte Ed25519
    public keys) and, with ``log_key``, its transparency-log proof (and the witnesses'
    cosignatures; with ``log_url``, that its leaf is the job's first in the checkpointed tree).
    Never raises for a bad file: the result names the first failure."""
    result = DisclosureCheck()
    entries = HttpEntries(log_url) if log_url and log_key is not None else None
    try:
        _verify(data, list(seal_keys), (log_key, entries), witnesses, min_witnesses, result)
    except _Bad as exc:
        result.error = str(exc)
    finally:
        if entries is not None:
            entries.close()
    return result


class _Bad(Exception):
    """The first failed check (its message)."""


def _verify(
    data: bytes,
    seal_keys: list[bytes],
    log: tuple[Verifier | None, EntrySource | None],
    witnesses: Sequence[Verifier],
    min_witnesses: int | None,
    result: DisclosureCheck,
) -> None:
    log_key, entries = log
    if len(data) > MAX_DISCLOSURE_BYTES:
        raise _Bad(f"the file is larger than {MAX_DISCLOSURE_BYTES} bytes")
    try:
        doc = loads_unique(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Bad(f"the file is not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or set(doc) != _FIELDS or doc["type"] != DISCLOSURE_TYPE:
        raise _Bad(f"the file is not an {DISCLOSURE_TYPE} document")
    job_id, selector = doc["job_id"], doc["selector"]
    if not isinstance(job_id, str) or not isinstance(selector, str):
        raise _Bad("job_id and selector must be strings")
    if not 0 < len(selector) <= MAX_SELECTOR_CHARS:
        raise _Bad(f"the selector must be 1 to {MAX_SELECTOR_CHARS} characters")
    result.job_id, result.selector = job_id, selector
    seal = _checked_seal(doc["seal"], job_id, seal_keys)
    result.seal = {
        "version": seal.version,
        "key_id": seal.key_id,
        "event_count": seal.event_count,
        "sealed_at": seal.sealed_at,
        "events_root": seal.events_root,
    }
    events = doc["events"]
    if not isinstance(events, list) or not 0 < len(events) <= MAX_EVENTS:
        raise _Bad(f"events must be a list of 1 to {MAX_EVENTS} events")
    last = 0
    for position, event in enumerate(events):
        shown = _checked_event(event, position, seal, selector)
        if shown["version"] <= last:
            raise _Bad(f"event #{position}: versions must increase")
        last = shown["version"]
        result.events.append(shown)
    proof = doc["tlog_proof"]
    if proof is not None and not isinstance(proof, str):
        raise _Bad("tlog_proof must be a string or null")
    result.log = {"checked": False, "present": proof is not None}
    if log_key is None:
        return
    if proof is None:
        raise _Bad("the file holds no transparency-log proof, and --log-key asks for one")
    check = check_proof(
        proof, log_key, witnesses, min_witnesses=min_witnesses, expected_leaf=log_leaf(seal),
        entries=entries,
    )  # fmt: skip
    if not check.ok:
        raise _Bad(f"transparency log: {check.errors[0]}")
    result.log = {
        "checked": True,
        "present": True,
        "origin": check.origin,
        "tree_size": check.tree_size,
        "index": check.index,
        "witnesses": check.witnesses,
        "first_for_job": check.first_for_job,
        "first_checked": check.first_checked,
        "earliest_cosigned": (
            check.earliest_cosigned.to_dict() if check.earliest_cosigned is not None else None
        ),
    }


def _checked_seal(value: Any, job_id: str, seal_keys: list[bytes]) -> Seal:
    if not isinstance(value, dict):
        raise _Bad("the seal is not an object")
    try:
        seal = Seal.from_dict(value)
    except ValueError as exc:
        raise _Bad(f"the seal is malformed: {exc}") from None
    if set(value) != set(seal.to_dict()):
        raise _Bad("the seal has fields a seal does not have")
    if seal.job_id != job_id:
        raise _Bad(f"the seal is for job {seal.job_id!r}, not {job_id!r}")
    if seal.version < 2 or seal.events_root is None:
        raise _Bad("the seal is v1: it signs no events root, so it proves no single event")
    if not 0 < seal.event_count <= 2**53:
        raise _Bad(f"the seal's event count {seal.event_count} is out of range")
    key = next((k for k in seal_keys if key_id_for(k) == seal.key_id), None)
    if key is None:
        raise _Bad(f"the seal is signed by key {seal.key_id}, which is not a given --key")
    try:
        error = check_signature(seal, key)
    except AffidavitError as exc:  # a field the signed message cannot hold
        error = f"the seal cannot be checked: {exc.message}"
    if error:
        raise _Bad(error)
    return seal


def _checked_event(event: Any, position: int, seal: Seal, selector: str) -> dict[str, Any]:
    """Check one shown event against the sealed root; what it proves, for the report."""
    where = f"event #{position}"
    if not isinstance(event, dict) or set(event) != _EVENT_FIELDS:
        raise _Bad(f"{where} is not a disclosed event")
    version, event_id, event_type = event["version"], event["event_id"], event["type"]
    previous, proof, payload = event["previous_chain_hash"], event["proof"], event["payload"]
    if type(version) is not int or not 1 <= version <= seal.event_count:
        raise _Bad(f"{where}: version must be an integer from 1 to {seal.event_count}")
    where = f"event {version}"
    if not isinstance(event_id, str) or not isinstance(event_type, str):
        raise _Bad(f"{where}: event_id and type must be strings")
    if not isinstance(previous, str) or not (
        (version == 1 and previous == "") or (version > 1 and _HEX64.match(previous))
    ):
        raise _Bad(f"{where}: previous_chain_hash must be 64 hex digits ('' for version 1)")
    if not isinstance(proof, list) or len(proof) > MAX_PROOF_HASHES:
        raise _Bad(f"{where}: proof must be a list of at most {MAX_PROOF_HASHES} hashes")
    if not all(isinstance(h, str) and _HEX64.match(h) for h in proof):
        raise _Bad(f"{where}: every proof hash must be 64 hex digits")
    if not selects(selector, event_type, payload, version):
        raise _Bad(f"{where} ({event_type}) is not part of {selector!r}")
    try:
        payload_bytes = canonical_of_parsed(payload)
    except AffidavitError as exc:
        raise _Bad(f"{where}: the payload is not canonical JSON: {exc.message}") from None
    except RecursionError:
        raise _Bad(f"{where}: the payload is nested too deeply") from None
    try:
        head = chain_next(
            bytes.fromhex(previous) if previous else GENESIS, event_id, event_type, payload_bytes
        )
    except UnicodeEncodeError:
        raise _Bad(f"{where}: event_id or type is not UTF-8 text") from None
    if version == seal.event_count and head.hex() != seal.event_chain_root_hash:
        raise _Bad(f"{where}: the last event's chain hash is not the sealed chain root")
    try:
        verify_inclusion(
            leaf_hash(head),
            version - 1,
            seal.event_count,
            [bytes.fromhex(h) for h in proof],
            bytes.fromhex(seal.events_root or ""),
        )
    except ProofError as exc:
        raise _Bad(f"{where}: not in the sealed log: {exc.message}") from None
    return {
        "version": version,
        "event_id": event_id,
        "type": event_type,
        "node_id": payload.get("node_id") if isinstance(payload, dict) else None,
        "step_id": payload.get("step_id") if isinstance(payload, dict) else None,
        "chain_hash": head.hex(),
    }
