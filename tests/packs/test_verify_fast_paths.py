"""The fast paths of verify_pack agree with the checked paths they stand in for.

Each fast path answers only for input it is sure about and otherwise defers to the checked
path (the code as it was before the fast path existed). Here each pair is compared directly on
generated input, and the whole verifier with every fast path on is compared with the verifier
with every fast path off, on fuzzed packs: same verdict, phase, errors, details and receipt.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit import Tool, ToolContext, ToolRegistry
from affidavit.core.canonical import canonical, canonical_parsed_all
from affidavit.core.errors import AffidavitError
from affidavit.packs import _episode, _eventlog, _integrity, _json, _schemas, export_pack
from affidavit.packs import _format as F
from affidavit.packs._files import PlainFiles, read, safe_path
from affidavit.packs._state import Fail, State
from affidavit.packs.verify import PackVerdict, verify_pack
from tests.conftest import examples
from tests.packs import assay_packs
from tests.packs.helpers import assay_verify, resign, run_job
from tests.packs.test_fuzz import WRONG, _apply, _files, mutations

LIMIT = State(Path(".")).max_file_bytes  # the default bound of a file of a pack

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = {"a": [leaf]}
    return leaf


# --- lines of a JSON-lines file ----------------------------------------------------------------

LINES = st.lists(
    st.one_of(
        JSON.map(lambda v: json.dumps(v).encode()),
        st.sampled_from(
            [b"", b"  ", b"\r", b"1e999", b"NaN", b'"\\ud800"', b"[1,", b"\xff\xfe", b"{} x"]
        ),
        st.integers(min_value=2**64, max_value=2**80).map(lambda n: str(n).encode()),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(lines=LINES)
def test_loads_lines_agrees_with_line_by_line(lines: list[bytes]) -> None:
    data = b"\n".join(lines) + b"\n"
    try:
        expected: Any = _json.loads_each_line(data, "f")
    except Fail as exc:
        expected = str(exc)
    try:
        got: Any
        got, strict = _json.loads_lines(data, "f")
    except Fail as exc:
        got, strict = str(exc), False
    assert repr(got) == repr(expected)  # repr: 1 and 1.0 apart
    # "strict" (no NaN, infinity, lone surrogate: see canonicalizable) only when orjson read all
    assert strict == all(_orjson_reads(line) for line in data.split(b"\n") if line.strip())


def _orjson_reads(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


# --- every receipt canonicalizes ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(values=st.lists(JSON, max_size=4))
def test_canonicalizable_means_canonical_accepts_each(values: list[Any]) -> None:
    parsed = orjson.loads(orjson.dumps(values)) if _dumps(values) else values
    if _json.canonicalizable(parsed):
        for value in parsed:
            canonical(value)  # must not raise


def _dumps(values: list[Any]) -> bool:
    try:
        orjson.dumps(values)
    except orjson.JSONEncodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2**53 - 1, True),
        (-(2**53 - 1), True),
        (2**53, False),
        (-(2**53), False),
        (1.5, True),
        (_nested(100, 1), True),
        (_nested(200, 5.0), False),  # deeper than orjson writes: not known, full path
    ],
)
def test_canonicalizable_cases(value: Any, expected: bool) -> None:
    assert _json.canonicalizable([value]) is expected
    if expected:
        canonical(value)


# --- canonical bytes of parsed values -----------------------------------------------------------

TRICKY = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5.0, -0.0, 0.0, 1e16, 1e21, 1e-5, 1e-6, 1e-7, 9.99e-6, 1.25, 2**53 - 1]),
    st.sampled_from(["13:00:29.0Z", "a:1e-5", "x,1.0}", "\U0001f600", "\uffff", "e-", "e+1"]),
    st.integers(min_value=-(2**60), max_value=2**60),
)
PARSED = st.recursive(
    st.none() | st.booleans() | st.text(max_size=6) | TRICKY,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(["\U0001f600", "\uffff"]), children)
    ),
    max_leaves=12,
)


def _canonical_or_error(value: Any) -> bytes | str:
    try:
        return canonical(value)
    except AffidavitError as exc:
        return type(exc).__name__


@settings(max_examples=examples(250, 5000), deadline=None)
@given(values=st.lists(PARSED, max_size=6))
def test_canonical_all_is_canonical_of_each(values: list[Any]) -> None:
    expected = [_canonical_or_error(v) for v in values]
    try:
        got: list[bytes | str] = list(canonical_parsed_all(values))
    except AffidavitError as exc:  # raises exactly when canonical rejects one of them
        assert type(exc).__name__ in expected
        return
    assert got == expected


def test_canonical_all_cases() -> None:
    values = [{"at": "2026-11-22T13:00:29.0Z", "d": 1.25}, [5.0], {"\U0001f600": 1, "\uffff": 2}]
    assert canonical_parsed_all(values) == [canonical(v) for v in values]
    assert canonical_parsed_all([1e16, 1e-7, -0.0]) == [b"10000000000000000", b"1e-7", b"0"]
    with pytest.raises(AffidavitError):
        canonical_parsed_all([1, 2**53])


# --- the events of phase 5 --------------------------------------------------------------------


_JOB = "01a20358-04bb-7074-9d15-153cd200b626"
_EVENT_LINES = [
    canonical(
        {
            "job_id": _JOB,
            "version": n,
            "event_id": f"{n:032x}",
            "type": kind,
            "payload": payload,
            "chain_hash": f"{n:064x}",
        }
    )
    for n, (kind, payload) in enumerate(
        [
            ("job_created", {"at": "2026-11-22T13:00:29.176437Z", "input": {"x": 1}}),
            ("node_started", {"node_id": "a", "step_id": "s", "attempt": 1}),
            ("node_finished", {"node_id": "a", "duration_ms": 1.25, "output": [1, "x", None]}),
            ("job_completed", {"output": {"total": 3}}),
        ],
        start=1,
    )
]

EVENT_EDITS = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.sampled_from(["job_id", "version", "event_id", "type", "chain_hash", "payload", "x"]),
        st.one_of(
            WRONG,
            st.just("__delete__"),
            st.just(_JOB),
            st.sampled_from([5.0, 1e-7, 2**53, {"\U0001f600": 1}, True, 3]),
        ),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=EVENT_EDITS,
    whole=st.one_of(st.none(), WRONG),
    job_id=st.sampled_from([_JOB, 5]),
    strict=st.booleans(),
)
def test_event_rows_fast_agrees_with_checked(
    edits: list[tuple[int, str, Any]], whole: Any, job_id: Any, strict: bool
) -> None:
    events: list[Any] = [orjson.loads(line) for line in _EVENT_LINES]
    for index, key, value in edits:
        if value == "__delete__":
            events[index].pop(key, None)
        else:
            events[index][key] = value
    if whole is not None:
        events[1] = whole
    st_ = State(Path("."))
    checked = _eventlog._checked_rows(st_, copy.deepcopy(events), job_id)
    fast = _eventlog._rows(events, job_id, strict)
    if fast is None:
        # deferring is always allowed; with a string job id only for a malformed log
        assert checked is None or type(job_id) is not str
        return
    assert checked is not None and not st_.errors
    rows, parsed, entries = fast
    assert rows == [(s.version, s.event_id, s.type, s.payload_bytes, s.chain_hash) for s in checked]
    assert [kind for kind, _ in entries] == [s.type for s in checked]
    assert [canonical(p) for _, p in entries] == [s.payload_bytes for s in checked]
    if parsed is not None:
        # handed to the fold in place of parsing the rows' bytes: must be exactly that parse
        # (5.0 is not 5, True is not 1)
        sort = orjson.OPT_SORT_KEYS
        assert [orjson.dumps(p, option=sort) for p in parsed] == [
            orjson.dumps(orjson.loads(s.payload_bytes), option=sort) for s in checked
        ]


# --- recorded traces --------------------------------------------------------------------------


def test_plain_files_read_only_what_the_checked_read_reads(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    traces = root / F.TRACES_DIR
    traces.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_bytes(b'{"secret":1}')
    (traces / "plain.json").write_bytes(b'{"a":1}')
    (traces / "empty.json").write_bytes(b"")
    (traces / "big.json").write_bytes(b"[" + b"1," * 100_000 + b"1]")
    (traces / "inside.json").symlink_to("plain.json")
    (traces / "out.json").symlink_to(outside)
    (traces / "loop.json").symlink_to("loop.json")
    (traces / "dir.json").mkdir()
    os.mkfifo(traces / "fifo.json")
    (traces / "a b.json").write_bytes(b"1")
    (traces / ".hidden.json").write_bytes(b"1")
    names = [*(p.name for p in traces.iterdir()), "missing.json", "../outside.json", "x/y.json"]
    with PlainFiles(traces, LIMIT) as plain:
        for name in names:
            fast = plain.read(name)
            if fast is None:
                continue
            # whatever the fast read returns, the checked read returns too
            path = safe_path(traces, name, "recorded trace", plain=True, within=root)
            assert read(path, name, LIMIT) == fast, name
    with PlainFiles(traces, LIMIT) as plain:
        assert plain.read("plain.json") == b'{"a":1}'
        assert plain.read("big.json") == (traces / "big.json").read_bytes()
        for name in ("inside.json", "out.json", "loop.json", "dir.json", "fifo.json"):
            assert plain.read(name) is None, name  # never follows a link, never opens a FIFO


# --- contract schema keys and hashes ------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    a=JSON | st.sampled_from([float("inf"), float("-inf"), None, 2**65]),
    b=JSON | st.sampled_from([float("inf"), float("-inf"), None, 2**65]),
)
def test_shape_keys_equal_exactly_when_json_texts_do(a: Any, b: Any) -> None:
    def text(value: Any) -> str:
        try:
            return json.dumps(value, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return "#"

    assert (_schemas._shape_key(a, 0) == _schemas._shape_key(b, 1)) == (text(a) == text(b) != "#")


CONTRACT_EDITS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                ("environment", "tool_versions"),
                ("environment",),
                ("inputs",),
                ("replay_policy",),
                ("replay_policy", "comparator_tier"),
                ("replay_script",),
                ("replay_script", "steps"),
            ]
        ),
        st.one_of(
            WRONG,
            JSON,
            st.sampled_from(
                [{"\U0001f600": 1, "\uffff": 2}, [5.0, 1e21, 1e-7], _nested(300, 1), 2**60]
            ),
        ),
    ),
    max_size=3,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=CONTRACT_EDITS, drop=st.booleans(), strict=st.booleans())
def test_contract_hashes_agree_with_direct_hashes(
    edits: list[tuple[tuple[str, ...], Any]], drop: bool, strict: bool
) -> None:
    check_contract_hashes(edits, drop, strict)


def check_contract_hashes(
    edits: list[tuple[tuple[str, ...], Any]], drop: bool, strict: bool
) -> None:
    """The contract's three hashes, computed once per verification from the parts' bytes, are
    the hashes of the values themselves, or fail as those do."""
    contract = assay_packs._contract(assertion=False)
    for path, value in edits:
        target = contract
        for part in path[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[path[-1]] = value
    if drop:
        contract.pop("replay_policy", None)
    if strict:  # as orjson would have parsed it
        try:
            contract = orjson.loads(orjson.dumps(contract))
        except orjson.JSONEncodeError:
            strict = False
    state = State(Path("."), contract=contract, contract_strict=strict)
    for name, value in (
        ("episode_spec_hash", F.episode_spec_view(contract)),
        ("inputs_hash", contract.get("inputs")),
        ("script_hash", contract.get("replay_script")),
    ):
        try:
            expected = _json.hash_value(value, name)
        except Fail as exc:
            expected = f"fail: {exc}"
        try:
            got = _episode.contract_hash(state, name)
        except Fail as exc:
            got = f"fail: {exc}"
        assert got == expected, name


def _lists(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("strict", [False, True], ids=["as-given", "strict"])
@pytest.mark.parametrize("depth", [253, 254, 255])
@pytest.mark.parametrize("part", ["inputs", "replay_policy", "replay_script", "environment"])
def test_contract_hashes_agree_at_the_canonical_depth_limit(
    part: str, depth: int, strict: bool
) -> None:
    """A part 254 containers deep canonicalizes alone (the limit is 254) but not inside the
    spec view, one level deeper: the spec hash built from the parts' bytes hashed it anyway,
    where the exact hash fails (found by the property test above)."""
    check_contract_hashes([((part,), _lists(depth))], drop=False, strict=strict)


# --- the whole verifier: fast paths on and off ----------------------------------------------------


def _norm(verdict: PackVerdict) -> tuple[Any, ...]:
    receipt = {
        k: v
        for k, v in verdict.receipt.items()
        if k not in ("timestamp", "receipt_id", "receipt_hash")
    }
    details = json.loads(json.dumps(verdict.details, default=str))
    return verdict.verdict, verdict.exit_code, verdict.phase, verdict.errors, receipt, details


def _without_fast_paths(pack: Path, now: datetime) -> PackVerdict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_eventlog, "_rows", lambda events, job_id, strict: None)
        mp.setattr(PlainFiles, "read", lambda self, name: None)
        mp.setattr(_integrity, "canonicalizable", lambda values: False)
        mp.setattr(_integrity, "loads_lines", lambda d, n: (_json.loads_each_line(d, n), False))
        mp.setattr(_eventlog, "loads_lines", lambda d, n: (_json.loads_each_line(d, n), False))
        mp.setattr(_schemas, "_shape_key", _json_shape_key)
        mp.setattr(_episode, "_part_jcs", lambda st_, part: None)
        mp.setattr(
            _episode, "_trace_hashes", lambda parsed: [_episode._trace_hash(*p) for p in parsed]
        )
        mp.setattr(_eventlog, "canonical_parsed_all", _each)
        mp.setattr(_integrity, "canonical_parsed_all", _each)
        return verify_pack(pack, now=now)


def _each(values: list[Any]) -> list[bytes]:
    return [canonical(value) for value in values]


def _json_shape_key(shape: Any, index: int) -> str | bytes:
    try:
        return json.dumps(shape, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return f"#{index}"


def _same_with_and_without(pack: Path) -> PackVerdict:
    now = datetime.now(UTC)
    verdict = verify_pack(pack, now=now)
    assert _norm(verdict) == _norm(_without_fast_paths(pack, now))
    return verdict


TRACE_EDITS = st.tuples(
    st.integers(0, 10**6),
    st.sampled_from(["symlink_in", "symlink_out", "loop", "dir", "fifo", "remove", "rewrite"]),
    st.one_of(WRONG, JSON),
)


def _edit_trace(pack: Path, index: int, how: str, value: Any) -> None:
    traces = pack / F.TRACES_DIR
    names = sorted(os.listdir(traces)) if traces.is_dir() else []
    if not names:
        return
    victim = traces / names[index % len(names)]
    if victim.is_symlink() or not victim.is_file():
        return
    if how == "rewrite":
        victim.write_text(json.dumps(value, indent=1))
        return
    victim.unlink()
    if how == "symlink_in":
        victim.symlink_to(names[(index + 1) % len(names)])
    elif how == "symlink_out":
        victim.symlink_to(pack.parent / "outside.json")
    elif how == "loop":
        victim.symlink_to(victim.name)
    elif how == "dir":
        victim.mkdir()
    elif how == "fifo":
        os.mkfifo(victim)


def _fuzz_both_ways(base: Path, examples: int) -> None:
    files = _files(base)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutation=mutations(files), trace=st.none() | TRACE_EDITS)
    def run(mutation: tuple[str, Any], trace: tuple[int, str, Any] | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            pack = Path(tmp) / "pack"
            shutil.copytree(base, pack, symlinks=True)
            (Path(tmp) / "outside.json").write_text('{"outside":1}')
            _apply(pack, *mutation)
            if trace is not None:
                _edit_trace(pack, *trace)
            _same_with_and_without(pack)

    run()


@pytest.fixture
def exported(make_runtime: Callable[..., Any], tmp_path: Path) -> Iterator[Path]:
    rt, job_id = run_job(make_runtime, "failed", tmp_path / "data")
    yield export_pack(rt.store, job_id, tmp_path / "pack").pack_dir


def test_fast_paths_change_nothing_on_fuzzed_exported_packs(exported: Path) -> None:
    assert _same_with_and_without(exported).verdict == "MATCH"  # every phase ran
    _fuzz_both_ways(exported, 40)


def test_fast_paths_change_nothing_on_fuzzed_assay_packs(tmp_path: Path) -> None:
    for scenario in (*assay_packs.SCENARIOS, *assay_packs.CRASHES):
        verdict = _same_with_and_without(assay_packs.build(tmp_path / scenario, scenario))
        assert verdict.verdict == assay_packs.SCENARIOS.get(scenario, ("INTEGRITY_FAIL",))[0]
    _fuzz_both_ways(assay_packs.build(tmp_path / "base", "valid"), 40)


def test_doubles_beyond_2_53_in_the_log_match(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    """JCS writes a double from 2^53 on without a fraction (1.7e18 as 1700000000000000000),
    which orjson reads as an int: a log holding such numbers — in the input, a tool's result
    next to a number orjson writes otherwise (0.000001), the output — still matches, with and
    without the fast paths and for assay; an edited event is still caught."""

    def measure(ctx: ToolContext, budget: float) -> dict[str, Any]:
        return {"elapsed_ns": 1.7e18, "tolerance": 1e-6, "budget": budget}

    rt = make_runtime(ToolRegistry([Tool("measure", measure, "tool")]))
    job_plan = {
        "name": "measure",
        "nodes": [{"id": "m", "type": "tool", "tool": "measure", "args": {"budget": "${input.b}"}}],
    }
    job_id = rt.submit(job_plan, {"b": 1e16}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    pack = export_pack(rt.store, job_id, tmp_path / "pack").pack_dir
    assert b"1700000000000000000" in (pack / F.EVENTS).read_bytes()
    verdict = _same_with_and_without(pack)
    assert (verdict.verdict, verdict.errors) == ("MATCH", [])
    code, receipt, details = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt.get("verdict")) == (0, "MATCH"), details

    events = pack / F.EVENTS
    events.write_bytes(events.read_bytes().replace(b"1700000000000000000", b"1700000000000000256"))
    assert (_same_with_and_without(pack).verdict, _same_with_and_without(pack).phase) == (
        "INTEGRITY_FAIL",
        2,  # the manifest's hash of the log
    )
    resign(pack)
    edited = _same_with_and_without(pack)
    assert (edited.verdict, edited.phase) == ("INTEGRITY_FAIL", 5)


def test_verify_pack_restores_the_garbage_collector(tmp_path: Path) -> None:
    import gc

    pack = assay_packs.build(tmp_path, "valid")
    assert gc.isenabled()
    assert verify_pack(pack).verdict == "MATCH"
    assert gc.isenabled()
    gc.disable()
    try:
        verify_pack(tmp_path / "missing")
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
