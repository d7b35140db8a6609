"""Fuzz: structural mutations of valid packs never make the verifier raise; the verdict is
always one of MATCH/DIVERGE/INTEGRITY_FAIL, and a real change is never MATCH. The default run is
bounded; ``--soak`` (make test-all) runs 10,000 examples."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.packs import _format as F
from affidavit.packs import export_pack, verify_pack, write_verdict
from affidavit.packs.verify import result_errors
from tests.packs import assay_packs
from tests.packs.helpers import run_job


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**30, -(10**25), 1e300, 0.1, 1e21, 1e-7]),
    st.text(max_size=20),
    st.just("../../etc/passwd"),
    st.just("/etc/passwd"),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(min_value=50, max_value=900).map(lambda n: _nested(n)),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = new
    return doc


@st.composite
def mutations(draw: st.DrawFn, files: list[str]) -> tuple[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "receipts",
                "json_value",
                "json_delete",
                "bytes",
                "whitespace",
                "path_escape",
                "remove",
            ]
        )
    )
    if kind == "receipts":
        op = draw(st.sampled_from(["drop", "duplicate", "swap", "retype", "field"]))
        return kind, (op, draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)), draw(WRONG))
    name = draw(st.sampled_from(files))
    if kind in ("json_value", "json_delete"):
        return kind, (name, draw(st.integers(0, 10**6)), draw(WRONG))
    if kind == "bytes":
        chunk = draw(st.sampled_from([b"\xff\xfe", b"\x00", b"\xc3\x28", b"", b"}"]))
        return kind, (name, draw(st.integers(0, 10**6)), chunk, draw(st.booleans()))
    if kind == "path_escape":
        where = draw(st.sampled_from(["manifest_files", "input_ref", "step_id"]))
        return kind, (where, draw(st.sampled_from(["../x", "/etc/passwd", "a/../../b", "..", ""])))
    return kind, name


def _apply(pack: Path, kind: str, arg: Any) -> bool:
    """Apply one mutation; True when it is semantically neutral (MATCH allowed)."""
    if kind == "receipts":
        op, i, j, value = arg
        lines = (pack / F.RECEIPTS).read_text().splitlines()
        i, j = i % len(lines), j % len(lines)
        if op == "drop":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "swap":
            if i == j:
                return True
            lines[i], lines[j] = lines[j], lines[i]
        else:
            receipt = json.loads(lines[i])
            key = "type" if op == "retype" else sorted(receipt)[j % len(receipt)]
            if receipt.get(key) == value:
                return True
            receipt[key] = value
            lines[i] = json.dumps(receipt)
        (pack / F.RECEIPTS).write_text("\n".join(lines) + "\n")
        return False
    if kind == "remove":
        (pack / arg).unlink()
        return False
    if kind == "whitespace":
        path = pack / arg
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            return True
        if arg in (F.RECEIPTS, F.EVENTS, F.REPORT) or arg.startswith(F.INPUTS_DIR):
            # bytes hashed as they are: any change is a change
            path.write_text(json.dumps(doc, indent=3) + "\n")
            return path.read_bytes() == (pack / arg).read_bytes() and False
        path.write_text(json.dumps(doc, indent=3) + "\n")
        return True
    if kind in ("json_value", "json_delete"):
        name, pick, value = arg
        path = pack / name
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            return True
        paths = list(_paths(doc))
        chosen = paths[pick % len(paths)]
        if kind == "json_delete":
            if not chosen:
                return True
            parent = doc
            for part in chosen[:-1]:
                parent = parent[part]
            del parent[chosen[-1]]
        else:
            parent_value = doc
            for part in chosen:
                parent_value = parent_value[part]
            if parent_value == value and type(parent_value) is type(value):
                return True
            doc = _set(doc, chosen, value)
        path.write_text(json.dumps(doc))
        # the objective is descriptive and optional (RCE profile §2.2, the contract schema):
        # assay's packs do not bind it, so another text or none at all changes no verdict
        descriptive = kind == "json_delete" or isinstance(value, str)
        return name == F.CONTRACT and chosen == ("objective",) and descriptive
    if kind == "bytes":
        name, at, chunk, replace = arg
        data = bytearray((pack / name).read_bytes())
        at = at % (len(data) + 1)
        if replace:
            data[at : at + len(chunk)] = chunk
        else:
            data[at:at] = chunk
        if bytes(data) == (pack / name).read_bytes():
            return True
        (pack / name).write_bytes(bytes(data))
        return False
    where, bad = arg
    if where == "manifest_files":
        manifest = json.loads((pack / F.MANIFEST).read_text())
        manifest["files"][0]["path"] = bad
        (pack / F.MANIFEST).write_text(json.dumps(manifest))
    elif where == "input_ref":
        contract = json.loads((pack / F.CONTRACT).read_text())
        contract["inputs"][0]["ref"] = bad
        (pack / F.CONTRACT).write_text(json.dumps(contract))
    else:
        contract = json.loads((pack / F.CONTRACT).read_text())
        contract["replay_script"]["steps"][1]["step_id"] = bad
        (pack / F.CONTRACT).write_text(json.dumps(contract))
    return False


def _files(pack: Path) -> list[str]:
    return sorted(
        p.relative_to(pack).as_posix()
        for p in pack.rglob("*")
        if p.is_file() and not p.relative_to(pack).as_posix().startswith(F.UNSIGNED_DIR)
    )


def _check(base: Path, kind: str, arg: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pack = Path(tmp) / "pack"
        shutil.copytree(base, pack)
        neutral = _apply(pack, kind, arg)
        verdict = verify_pack(pack)  # must not raise
        assert verdict.exit_code in (0, 1, 2)
        assert result_errors(verdict.receipt) == []
        if not neutral:
            assert verdict.exit_code in (1, 2), (kind, arg, verdict.verdict)
        write_verdict(verdict, Path(tmp) / "out")  # the details always serialize


@pytest.fixture
def exported(make_runtime: Callable[..., Any], tmp_path: Path) -> Path:
    rt, job_id = run_job(make_runtime, "failed", tmp_path / "data")
    return export_pack(rt.store, job_id, tmp_path / "pack").pack_dir


def _fuzz(base: Path, examples: int) -> None:
    files = _files(base)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutation=mutations(files))
    def run(mutation: tuple[str, Any]) -> None:
        _check(base, *mutation)

    run()


def test_fuzz_exported_pack(exported: Path) -> None:
    _fuzz(exported, 60)


def test_fuzz_assay_built_pack(tmp_path: Path) -> None:
    _fuzz(assay_packs.build(tmp_path, "valid"), 60)


@pytest.mark.soak
def test_fuzz_exported_pack_10000(exported: Path) -> None:
    _fuzz(exported, 10_000)


@pytest.mark.parametrize(
    "mutation",
    [
        ("json_value", (F.CONTRACT, 0, {"environment": 5})),
        ("json_value", (F.CONTRACT, 0, [1, 2])),
        ("json_value", (F.MANIFEST, 0, {"attestation": 7, "files": "x"})),
        ("json_value", (F.RECEIPTS, 0, None)),
        ("bytes", (F.CONTRACT, 0, b"\xff\xfe", False)),
        ("path_escape", ("manifest_files", "../x")),
        ("path_escape", ("input_ref", "/etc/passwd")),
        ("path_escape", ("step_id", "a/../../b")),
        ("receipts", ("retype", 0, 0, "loom.x/v0")),
        ("receipts", ("field", 1, 3, _nested(900))),
    ],
)
def test_known_malformations(tmp_path: Path, mutation: tuple[str, Any]) -> None:
    _check(assay_packs.build(tmp_path, "valid"), *mutation)


STEP_VALUES = st.one_of(
    WRONG,
    st.sampled_from(
        [
            "LOAD_INPUT",
            "EMIT_OUTPUT",
            "ASSERT_HASH",
            {"transform": "x"},
            {"transform": "x", "extra": 1},
            {"ref": "input.json"},
            ["a", "a"],
            ["a", "b"],
            [1],
        ]
    ),
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, 39),
            st.sampled_from(["step_id", "opcode", "params", "depends_on", "output_schema", "x"]),
            STEP_VALUES,
        ),
        max_size=4,
    )
)
def test_contract_validation_by_step_shape_equals_full_validation(
    edits: list[tuple[int, str, Any]],
) -> None:
    from affidavit.packs.verify import contract_schema_errors, schema_errors

    contract = json.loads(assay_packs_contract())
    steps = contract["replay_script"]["steps"]
    template = steps[1]
    steps[1:2] = [dict(template, step_id=f"m{i:02d}", depends_on=["s01"]) for i in range(38)]
    for index, key, value in edits:
        steps[index][key] = value
    full = schema_errors(F.SCHEMA_NAMES[2], contract)
    fast = contract_schema_errors(contract)
    assert sorted(e.split(":")[0] for e in fast) == sorted(e.split(":")[0] for e in full)


def assay_packs_contract() -> str:
    return json.dumps(assay_packs._contract(assertion=False))
