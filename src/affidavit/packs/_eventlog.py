"""Phase 5 of docs/packs.md ("Verification"), affidavit's extension: when a pack carries
``affidavit.*`` receipts, the job's whole event log (``events.ndjson``) is re-verified offline —
its hash, chain root, execution hash, ledger, replay proof and seal — and the recorded traces and
the input file are bound to it."""

from __future__ import annotations

import operator
from typing import Any

from affidavit.core.canonical import (
    canonical,
    canonical_of_parsed,
    canonical_parsed_all,
    canonical_parsed_exact,
    unsafe_integers_as_doubles,
)
from affidavit.core.errors import AffidavitError
from affidavit.core.seal import PUBLIC_KEY_BYTES
from affidavit.packs import _format as F
from affidavit.packs._files import read
from affidavit.packs._json import loads_lines
from affidavit.packs._log_traces import LogTraces, log_traces
from affidavit.packs._state import Fail, State, payload
from affidavit.store import StoredEvent
from affidavit.verify.result import VerificationResult
from affidavit.verify.verification import verify_event_rows

Row = tuple[int, str, str, bytes, str | None]  # (version, event_id, type, payload, chain hash)


def check_event_log(
    st: State, traces: dict[str, str], trusted: set[bytes] | None = None
) -> dict[str, Any]:
    """Phase 5. ``trusted``: the pinned keys (see :func:`~affidavit.packs.verify.verify_pack`);
    the job's seal must be signed by one of them, not only by the key the pack carries for it
    (a pack is signed by whoever exports it, whatever key signed the seal)."""
    found = _our_receipts(st)
    if found is None:
        return {"present": False}
    if st.errors:
        return {"present": True}
    log, seal_r, ledger_r = (found[n][0] for n in (F.EVENT_LOG, F.SEAL, F.LEDGER))
    opened = [r for r, kind in zip(st.receipts, st.kinds, strict=True) if kind == F.OPEN]
    if opened and opened[0].get("objective") != (st.contract or {}).get("objective"):
        # descriptive for RCE, but an affidavit pack binds it like everything else
        st.errors.append(f"{F.CONTRACT}: objective differs from the {F.OPEN} receipt")
    try:
        data = read(st.root / F.EVENTS, F.EVENTS, st.max_file_bytes)
    except Fail as exc:
        st.errors.append(str(exc))
        return {"present": True}
    if log.get("events_sha256") != F.prefixed(data):
        st.errors.append(f"{F.EVENTS}: sha256 does not match the {F.EVENT_LOG} receipt")
    try:
        events, strict = loads_lines(data, F.EVENTS)
    except Fail as exc:
        st.errors.append(str(exc))
        return {"present": True}
    digests = _ledger_digests(st, ledger_r.get("rows"))
    seal = seal_r.get("seal")
    job_id = st.receipts[0].get("run_id") if isinstance(st.receipts[0], dict) else None
    status = log.get("job_status")
    seal_keys = _seal_keys(trusted, seal_r.get("public_key"))
    read_rows = _event_rows(st, events, job_id, strict)
    if read_rows is None:
        return {"present": True}
    job_id, rows, parsed, log_entries = read_rows
    try:
        result = verify_event_rows(
            job_id,
            rows,
            parsed=parsed,
            public_keys=seal_keys,
            seal=seal if isinstance(seal, dict) else None,
            ledgers=[digests],
            status=status if isinstance(status, str) else None,
        )
    except AffidavitError as exc:
        st.errors.append(f"{F.EVENTS}: {exc.message}")
        return {"present": True}
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        st.errors.append(f"{F.EVENTS}: malformed ({type(exc).__name__}: {str(exc)[:200]})")
        return {"present": True}
    _bind_result(st, log, result, log_entries, traces)
    return {"present": True, "job_verification": result.to_dict()}


def _our_receipts(st: State) -> dict[str, list[dict[str, Any]]] | None:
    """affidavit's receipts by type (``None``: the pack has none); an unknown type, or a type
    not there exactly once, is an error."""
    # st.kinds[i] is rtype(st.receipts[i]): "" for a receipt that is not an object
    ours = [
        (r, kind)
        for r, kind in zip(st.receipts, st.kinds, strict=True)
        if kind.startswith("affidavit.")
    ]
    if not ours:
        return None
    found: dict[str, list[dict[str, Any]]] = {F.EVENT_LOG: [], F.SEAL: [], F.LEDGER: []}
    for r, kind in ours:
        if kind in found:
            found[kind].append(r)
        else:
            st.errors.append(f"{F.RECEIPTS}: unknown affidavit receipt type {kind!r}")
    for name, items in found.items():
        if len(items) != 1:
            st.errors.append(f"{F.RECEIPTS}: {len(items)} {name} receipts, expected one")
    return found


def _ledger_digests(st: State, rows: Any) -> list[tuple[str, str, str, str | None]]:
    """The ledger receipt's rows in the digest form ``verify_event_rows`` compares."""
    digests: list[tuple[str, str, str, str | None]] = []
    for row in rows if isinstance(rows, list) else [None]:
        if isinstance(row, dict):
            key, row_status, invocation = (
                row.get("idempotency_key"),
                row.get("status"),
                row.get("invocation_id"),
            )
            if isinstance(key, str) and isinstance(row_status, str) and isinstance(invocation, str):
                result_hash = row.get("result_hash")
                digests.append(
                    (
                        key,
                        row_status,
                        invocation,
                        result_hash if isinstance(result_hash, str) else None,
                    )
                )
                continue
        st.errors.append(f"{F.LEDGER}: malformed ledger row")
    return digests


def _seal_keys(trusted: set[bytes] | None, public: Any) -> list[bytes | str]:
    """The keys the seal may be signed with: the pinned ones, else the one the pack carries."""
    if trusted is not None:  # (a malformed pinned key pins nothing)
        return [k for k in trusted if len(k) == PUBLIC_KEY_BYTES]
    return [public] if isinstance(public, str) else []


def _event_rows(
    st: State, events: list[Any], job_id: Any, strict: bool
) -> tuple[str, list[Any], list[Any] | None, list[Any]] | None:
    """The job id, the events as rows (with their payloads parsed, on the fast path) and the
    log's entries to replay; ``None`` (an error is recorded) when they cannot be read."""
    fast = _rows(events, job_id, strict)
    parsed: list[Any] | None = None
    if fast is not None:
        rows, parsed, log_entries = fast
    else:
        checked = _checked_rows(st, events, job_id)
        if checked is None:
            return None
        rows = [(e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in checked]
        log_entries = [(e["type"], unsafe_integers_as_doubles(e["payload"])) for e in events]
    if not isinstance(job_id, str):
        if not rows:
            st.errors.append(f"{F.EVENTS}: the events name no job id")
            return None
        job_id = str(job_id)  # what each checked event was stored under
    return job_id, rows, parsed, log_entries


def _bind_result(
    st: State,
    log: dict[str, Any],
    result: VerificationResult,
    log_entries: list[Any],
    traces: dict[str, str],
) -> None:
    """Every failing check of the job's verification is an error, the event log receipt binds
    its values, and a verified log's traces and statuses are the pack's."""
    for check in result.checks():
        if not check.ok:
            st.errors.append(f"{F.EVENTS}: {check.name}: {check.detail}")
    for name, value in (
        ("event_count", result.stored_chain.event_count),
        ("event_chain_root_hash", result.event_chain_root_hash),
        ("execution_hash", result.execution_hash),
    ):
        if log.get(name) != value:
            st.errors.append(f"{F.EVENT_LOG}: {name} does not match {F.EVENTS}")
    if result.ok:
        try:
            expected = log_traces(log_entries, result.job_id)
        except (KeyError, TypeError, AttributeError) as exc:
            st.errors.append(f"{F.EVENTS}: cannot be replayed ({type(exc).__name__}: {exc})")
        else:
            _bind_traces(st, expected, traces)
            _bind_statuses(st, expected)


# Every field of an event line, in one C-level call per event.
_FIELDS = operator.itemgetter("job_id", "version", "event_id", "type", "chain_hash", "payload")


def _rows(
    events: list[Any], job_id: Any, strict: bool
) -> tuple[list[Row], list[Any] | None, list[tuple[str, Any]]] | None:
    """The events as rows for :func:`~affidavit.verify.verification.verify_event_rows`, the
    parsed payloads when they are exactly what parsing the rows' JCS bytes gives (else
    ``None``), and the ``(type, parsed payload)`` of each; ``None`` when any event is not
    plainly well-formed — :func:`_checked_rows` then finds and names the first. Accepts only
    logs :func:`_checked_rows` accepts, with the same bytes (every parsed log it accepts, when
    the job id is a string). ``strict``: orjson parsed the events (see
    :func:`~affidavit.core.canonical.canonical_parsed_all`)."""
    if type(job_id) is not str or not events or set(map(type, events)) != {dict}:
        return None
    try:  # each event's fields, then per field all events' values: C-level passes
        jobs, versions, event_ids, kinds, chain_hashes, payloads = zip(
            *map(_FIELDS, events), strict=True
        )
        if set(jobs) != {job_id}:
            return None
    except (KeyError, TypeError):  # a field missing; a job id that is not hashable
        return None
    if (
        set(map(type, versions)) != {int}
        or set(map(type, event_ids)) != {str}
        or set(map(type, kinds)) != {str}
        or set(map(type, chain_hashes)) != {str}
    ):
        return None
    values = list(payloads)
    exact = canonical_parsed_exact(values) if strict else None
    try:
        if exact is not None:
            payload_bytes = exact
        else:
            payload_bytes = canonical_parsed_all(values) if strict else list(map(canonical, values))
    except AffidavitError:
        # an integer beyond ±(2^53-1): an integral double the parser read as an int
        values = list(map(unsafe_integers_as_doubles, values))
        try:
            payload_bytes = list(map(canonical, values))
        except (AffidavitError, RecursionError):
            return None
    except RecursionError:
        return None
    rows: list[Row] = list(
        zip(versions, event_ids, kinds, payload_bytes, chain_hashes, strict=True)
    )
    return rows, (values if exact is not None else None), list(zip(kinds, values, strict=True))


def _checked_rows(st: State, events: list[Any], job_id: Any) -> list[StoredEvent] | None:
    """The events as stored events, checked one by one; ``None`` after recording the first
    malformed one in ``st.errors``."""
    stored: list[StoredEvent] = []
    for position, e in enumerate(events, start=1):
        try:
            stored.append(
                StoredEvent(
                    str(job_id),
                    e["version"],
                    e["event_id"],
                    e["type"],
                    canonical_of_parsed(e["payload"]),
                    e["chain_hash"],
                )
            )
        except (AffidavitError, KeyError, TypeError, RecursionError) as exc:
            st.errors.append(f"{F.EVENTS}: event {position} is malformed ({exc})")
            return None
        if e.get("job_id") != job_id or type(e["version"]) is not int:
            st.errors.append(f"{F.EVENTS}: event {position} is malformed")
            return None
        if not all(isinstance(e[k], str) for k in ("event_id", "type", "chain_hash")):
            st.errors.append(f"{F.EVENTS}: event {position} is malformed")
            return None
    return stored


def _bind_traces(st: State, expected: LogTraces, traces: dict[str, str]) -> None:
    """The recorded traces and the input file against the (verified) event log: a trace
    rewritten after export is an integrity failure here, not a divergence. ``expected``: one
    pass over the parsed events; the log's replay invariants were checked by
    ``verify_events`` already."""
    try:
        data = read(
            st.root / F.INPUTS_DIR / F.INPUT_REF,
            f"{F.INPUTS_DIR}/{F.INPUT_REF}",
            st.max_file_bytes,
        )
        if data != canonical(expected.job_input):
            st.errors.append(f"{F.INPUTS_DIR}/{F.INPUT_REF}: differs from the job's input")
    except (Fail, AffidavitError) as exc:
        st.errors.append(f"{F.INPUTS_DIR}/{F.INPUT_REF}: {exc}")
    values = [expected.of(sid) for sid in traces]
    try:
        # every payload canonicalized already, so none holds NaN or infinity
        hashes: list[str | None] = list(map(F.prefixed, canonical_parsed_all(values)))
    except (AffidavitError, RecursionError):
        hashes = list(map(_hash_or_none, values))
    for (sid, observed), value_hash in zip(traces.items(), hashes, strict=True):
        if observed == value_hash:
            continue
        mislabelled = expected.mislabelled(sid)
        if mislabelled is not None and observed == _hash_or_none(mislabelled[0]):
            st.errors.append(
                f"{F.TRACES_DIR}/{sid}.json: {mislabelled[1]}: the pack was exported by an "
                "affidavit that did not know the step's trace state (an answered approval or "
                "wait, a compensation); export the job again"
            )
        else:
            st.errors.append(f"{F.TRACES_DIR}/{sid}.json: differs from the event log")


def _bind_statuses(st: State, expected: LogTraces) -> None:
    """Each step's status against the (verified) event log: PASS exactly for the steps the
    log has pass. The traces bind what a step produced; this binds what the pack says of it —
    a step the log completed shown as FAIL (its dependents SKIPPED), or a failure shown as
    PASS, would otherwise be a consistent, signed pack that misstates the job."""
    for r, kind in zip(st.receipts, st.kinds, strict=True):
        if kind != F.STEP:
            continue
        p = payload(r)
        sid, status = p.get("step_id"), p.get("step_status")
        if not isinstance(sid, str) or status == "SKIPPED":
            continue  # (SKIPPED only after a FAIL or SKIPPED dependency: phase 3)
        passed = expected.passed(sid)
        if (status == "PASS") is not passed:
            st.errors.append(
                f"{F.STEP}[{sid}]: step_status {status} but the event log has the step "
                + ("pass" if passed else "not pass")
            )


def _hash_or_none(value: Any) -> str | None:
    try:
        return F.h(value)
    except (AffidavitError, RecursionError):
        return None
