"""Phases 3 and 4 of docs/packs.md: completeness — the receipts against the contract (one open
and one close, one step receipt per step, inputs, recomputed fields, SKIPPED shape, failure
propagation, chain integrity, traces that exist and parse) — and the comparison of each recorded
trace with its step's ``output_hash``."""

from __future__ import annotations

from typing import Any

from affidavit.core.canonical import canonical, canonical_parsed_all
from affidavit.core.errors import AffidavitError
from affidavit.packs import _format as F
from affidavit.packs._files import PlainFiles, plain_dir, read, safe_path
from affidavit.packs._json import hash_value, parse
from affidavit.packs._state import HASH, STATUSES, Fail, State, as_int, payload


def check_completeness(
    st: State, steps: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, str]]:
    contract = st.contract or {}
    # st.kinds[i] is rtype(st.receipts[i]): "" for a receipt that is not an object
    typed = list(zip(st.receipts, st.kinds, strict=True))
    opens = [r for r, kind in typed if kind == F.OPEN]
    closes = [r for r, kind in typed if kind == F.CLOSE]
    if len(opens) != 1:
        st.errors.append(f"{F.RECEIPTS}: {len(opens)} {F.OPEN} receipts, expected one")
    if len(closes) != 1:
        st.errors.append(f"{F.RECEIPTS}: {len(closes)} {F.CLOSE} receipts, expected one")
    st.close = closes[0] if closes else None
    by_id = _step_receipts(st, typed, {s["step_id"] for s in steps})
    episode_id = contract.get("episode_id")
    _check_inputs(st, contract)
    computed = _computed_hashes(st, contract)
    if opens:
        _check_open(st, payload(opens[0]), episode_id, computed, len(steps))
    if plain_dir(st.root, F.TRACES_DIR):
        with PlainFiles(st.root / F.TRACES_DIR, st.max_file_bytes) as plain:
            traces = _check_steps(st, steps, by_id, plain)
    else:
        traces = _check_steps(st, steps, by_id, None)
    payloads = [by_id[s["step_id"]] for s in steps if s["step_id"] in by_id]
    if closes:
        _check_close(st, payload(closes[0]), episode_id, computed, payloads, len(steps))
    return by_id, traces


def _step_receipts(
    st: State, typed: list[tuple[Any, str]], known: set[str]
) -> dict[str, dict[str, Any]]:
    """The step receipts' payloads by step id (each step of the script has exactly one)."""
    by_id: dict[str, dict[str, Any]] = {}
    for r, kind in typed:
        if kind != F.STEP:
            continue
        p = payload(r)
        sid = p.get("step_id")
        if not isinstance(sid, str) or not sid:
            st.errors.append(f"{F.RECEIPTS}: a step receipt has no step_id")
        elif sid not in known:
            st.errors.append(f"{F.RECEIPTS}: step receipt for unknown step {sid!r}")
        elif sid in by_id:
            st.errors.append(f"{F.RECEIPTS}: duplicate step receipt for {sid!r}")
        else:
            by_id[sid] = p
    for sid in sorted(known - set(by_id)):
        st.errors.append(f"{F.RECEIPTS}: no step receipt for step {sid!r}")
    return by_id


def _check_inputs(st: State, contract: dict[str, Any]) -> None:
    """Every input the contract names is in ``inputs/`` with the contract's hash."""
    inputs = contract.get("inputs")
    for item in inputs if isinstance(inputs, list) else []:
        ref = item.get("ref") if isinstance(item, dict) else None
        try:
            data = read(
                safe_path(st.root / F.INPUTS_DIR, ref, "input", within=st.root),
                f"inputs/{ref}",
                st.max_file_bytes,
            )
        except Fail as exc:
            st.errors.append(str(exc))
            continue
        if isinstance(item, dict) and item.get("hash") != F.prefixed(data):
            st.errors.append(f"inputs/{ref}: bytes do not match the contract's hash")


def _computed_hashes(st: State, contract: dict[str, Any]) -> dict[str, str | None]:
    """The contract's hashes as recomputed (``None``: it cannot be), and its environment's."""
    computed: dict[str, str | None] = {}
    for name in ("episode_spec_hash", "inputs_hash", "script_hash"):
        try:
            computed[name] = contract_hash(st, name)
        except Fail as exc:
            st.errors.append(f"{F.CONTRACT}: {exc}")
            computed[name] = None
    environment = contract.get("environment")
    computed["env_fingerprint_hash"] = (
        environment.get("env_fingerprint_hash") if isinstance(environment, dict) else None
    )
    return computed


def _check_open(
    st: State, o: dict[str, Any], episode_id: Any, computed: dict[str, str | None], n_steps: int
) -> None:
    if o.get("episode_id") != episode_id:
        st.errors.append(f"{F.OPEN}: episode_id does not match {F.CONTRACT}")
    for name in ("episode_spec_hash", "env_fingerprint_hash", "inputs_hash", "script_hash"):
        if o.get(name) != computed[name]:
            st.errors.append(f"{F.OPEN}: {name} does not match {F.CONTRACT}")
    if o.get("replay_basis") != "recorded_trace" or o.get("comparator_tier") != "A":
        st.errors.append(f"{F.OPEN}: replay_basis/comparator_tier must be recorded_trace/A")
    if as_int(o.get("n_steps")) != n_steps:
        st.errors.append(f"{F.OPEN}: n_steps does not match the replay script in {F.CONTRACT}")


def _check_close(
    st: State,
    c: dict[str, Any],
    episode_id: Any,
    computed: dict[str, str | None],
    payloads: list[dict[str, Any]],
    n_steps: int,
) -> None:
    if c.get("episode_id") != episode_id:
        st.errors.append(f"{F.CLOSE}: episode_id does not match {F.CONTRACT}")
    if c.get("episode_spec_hash") != computed["episode_spec_hash"]:
        st.errors.append(f"{F.CLOSE}: episode_spec_hash does not match {F.CONTRACT}")
    try:
        if c.get("outputs_hash") != F.outputs_hash(payloads):
            st.errors.append(f"{F.CLOSE}: outputs_hash does not match the step receipts")
    except (AffidavitError, RecursionError):
        st.errors.append(f"{F.CLOSE}: outputs_hash cannot be recomputed")
    passed = sum(1 for p in payloads if p.get("step_status") == "PASS")
    executed = sum(1 for p in payloads if p.get("step_status") in ("PASS", "FAIL"))
    if as_int(c.get("n_steps_executed")) != executed:
        st.errors.append(f"{F.CLOSE}: n_steps_executed does not match the step receipts")
    if as_int(c.get("n_steps_passed")) != passed:
        st.errors.append(f"{F.CLOSE}: n_steps_passed does not match the step receipts")
    if c.get("all_steps_passed") is not (passed == n_steps):
        st.errors.append(f"{F.CLOSE}: all_steps_passed does not match the step receipts")
    if c.get("replay_basis") != "recorded_trace" or c.get("comparator_tier") != "A":
        st.errors.append(f"{F.CLOSE}: replay_basis/comparator_tier must be recorded_trace/A")


def contract_hash(st: State, name: str) -> str:
    """``episode_spec_hash``, ``inputs_hash`` or ``script_hash`` of the contract (H of the spec
    view, of ``inputs``, of ``replay_script``), computed once per verification; :class:`Fail`
    as :func:`~affidavit.packs._json.hash_value` fails when it cannot be canonicalized."""
    found = st.contract_hashes.get(name)
    if found is None:
        found = st.contract_hashes[name] = _contract_hash(st, name)
    if isinstance(found, Fail):
        raise found
    return found


def _contract_hash(st: State, name: str) -> str | Fail:
    contract = st.contract or {}
    if name == "episode_spec_hash":
        # JCS of an object is its members' JCS in key order: the spec view's hash reuses the
        # script's bytes instead of canonicalizing the script a second time
        inputs, script = _part_jcs(st, "inputs"), _part_jcs(st, "replay_script")
        try:
            environment = _member(canonical([F.env_fingerprint_input(contract.get("environment"))]))
            policy = _member(canonical([contract.get("replay_policy")]))
        except (AffidavitError, RecursionError):
            environment = policy = b""  # not canonical: the exact path below says why
        if inputs is not None and script is not None and environment and policy:
            return F.prefixed(
                b'{"environment":%b,"inputs":%b,"replay_policy":%b,"replay_script":%b}'
                % (environment, inputs, policy, script)
            )
        value: Any = F.episode_spec_view(contract)
    else:
        part = "inputs" if name == "inputs_hash" else "replay_script"
        data = _part_jcs(st, part)
        if data is not None:
            return F.prefixed(data)
        value = contract.get(part)
    try:  # the exact failure, with the JSON path inside the hashed value
        return hash_value(value, name)
    except Fail as exc:
        return exc


def _part_jcs(st: State, part: str) -> bytes | None:
    """The JCS of a part of the contract, canonicalized one level deep — as a member of the
    spec view, where it is hashed too — so that a part nested too deeply to canonicalize there
    is ``None`` here as well (the exact path then says why; for the part's own hash it gives
    the same bytes, one level shallower)."""
    if part not in st.contract_jcs:
        wrapped = [(st.contract or {}).get(part)]
        try:
            st.contract_jcs[part] = _member(
                canonical_parsed_all([wrapped])[0] if st.contract_strict else canonical(wrapped)
            )
        except (AffidavitError, RecursionError):
            st.contract_jcs[part] = None
    return st.contract_jcs[part]


def _member(wrapped: bytes) -> bytes:
    """JCS(v) from JCS([v]): the brackets of a one-element array dropped."""
    return wrapped[1:-1]


def _check_steps(
    st: State,
    steps: list[dict[str, Any]],
    by_id: dict[str, dict[str, Any]],
    plain: PlainFiles | None,
) -> dict[str, str]:
    """Each step receipt against its step, in DAG order; H(recorded trace) of each step that
    ran. ``plain``: the traces directory is a plain one, read through it."""
    contract = st.contract or {}
    episode_id = contract.get("episode_id")
    policy = contract.get("replay_policy")
    policy = policy if isinstance(policy, dict) else {}
    overrides = policy.get("comparator_tiers_by_step")
    overrides = overrides if isinstance(overrides, dict) else {}
    traces: dict[str, str] = {}  # step id -> H(recorded trace)
    parsed_ids: list[str] = []  # the traces orjson read, hashed together at the end
    parsed: list[tuple[Any, bytes]] = []
    status: dict[str, str] = {}
    for step in steps:
        sid = step["step_id"]
        if sid not in by_id:
            continue
        p = by_id[sid]
        where = f"{F.STEP}[{sid}]"
        if p.get("episode_id") != episode_id:
            st.errors.append(f"{where}: episode_id does not match {F.CONTRACT}")
        if p.get("opcode") != step.get("opcode"):
            st.errors.append(f"{where}: opcode does not match the replay script in {F.CONTRACT}")
        if p.get("comparator_tier") != (overrides.get(sid) or policy.get("comparator_tier")):
            st.errors.append(f"{where}: comparator_tier does not match the replay policy")
        s = p.get("step_status")
        if s not in STATUSES:
            st.errors.append(f"{where}: invalid step_status {s!r}")
            continue
        status[sid] = s
        deps = [d for d in step.get("depends_on") or [] if isinstance(d, str)]
        blocked = any(status.get(d) in ("FAIL", "SKIPPED") for d in deps)
        if blocked and s != "SKIPPED":
            st.errors.append(f"{where}: a step after a FAIL or SKIPPED dependency must be SKIPPED")
        if not blocked and s == "SKIPPED":
            st.errors.append(f"{where}: SKIPPED without a FAIL or SKIPPED dependency")
        if s == "SKIPPED":
            if p.get("output_hash") is not None or p.get("input_hashes") != []:
                st.errors.append(f"{where}: SKIPPED needs output_hash null and input_hashes []")
            if p.get("output_size_bytes") != 0 or p.get("duration_ms") != 0:
                st.errors.append(f"{where}: SKIPPED needs output_size_bytes and duration_ms 0")
            continue
        if not isinstance(p.get("output_hash"), str) or not HASH.match(p["output_hash"]):
            st.errors.append(f"{where}: output_hash is not sha256:<64 hex>")
        expected_chain = [by_id[d].get("output_hash") if d in by_id else None for d in deps]
        if p.get("input_hashes") != expected_chain:
            st.errors.append(
                f"{where}: input_hashes do not match the dependencies' output hashes "
                "(chain integrity)"
            )
        # a plain trace in a plain directory is read directly; anything else the checked way
        data = plain.read(f"{sid}.json") if plain is not None else None
        try:
            if data is None:
                path = safe_path(
                    st.root / F.TRACES_DIR,
                    f"{sid}.json",
                    "recorded trace",
                    plain=plain is not None,
                    within=st.root,
                )
                data = read(path, f"{F.TRACES_DIR}/{sid}.json", st.max_file_bytes)
            value, strict = parse(data, f"{F.TRACES_DIR}/{sid}.json")
        except Fail as exc:
            st.errors.append(str(exc))
            continue
        if strict:
            traces[sid] = ""  # hashed below, with the others orjson read
            parsed_ids.append(sid)
            parsed.append((value, data))
        else:
            traces[sid] = _trace_hash(value, data)
    traces.update(zip(parsed_ids, _trace_hashes(parsed), strict=True))
    return traces


def _trace_hashes(parsed: list[tuple[Any, bytes]]) -> list[str]:
    """:func:`_trace_hash` of each ``(trace, bytes)`` orjson read, with one
    :func:`~affidavit.core.canonical.canonical_parsed_all`."""
    try:
        return list(map(F.prefixed, canonical_parsed_all([value for value, _ in parsed])))
    except (AffidavitError, RecursionError):
        return [_trace_hash(value, data) for value, data in parsed]


def _trace_hash(value: Any, data: bytes) -> str:
    try:
        return F.h(value)
    except (AffidavitError, RecursionError):
        # not JCS-representable here (e.g. an integer beyond 2^53): hash the raw bytes, which
        # then cannot match a canonical output hash
        return F.prefixed(data)


def compare(
    steps: list[dict[str, Any]], by_id: dict[str, Any], traces: dict[str, str]
) -> tuple[int, list[dict[str, Any]]]:
    replayed = 0
    divergent: list[dict[str, Any]] = []
    for step in steps:
        sid = step["step_id"]
        p = by_id[sid]
        if p.get("step_status") == "SKIPPED":
            continue
        replayed += 1
        observed = traces[sid]
        if observed != p.get("output_hash"):
            divergent.append(
                {
                    "step_id": sid,
                    "expected_output_hash": p.get("output_hash"),
                    "observed_output_hash": observed,
                    "comparator_tier": "A",
                    "comparator_detail": "JCS output hash mismatch",
                }
            )
    return replayed, divergent
