"""What a pack's files may be beyond their hashes: no JSON object giving a key twice (readers
keep the last or the first value, so two verifiers of one signed pack could see different
things), and no file larger than the bound (256 MiB by default), refused by its size before it
is read."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from affidavit.cli.main import load_commands
from affidavit.core.config import DEFAULT_PACK_MAX_FILE_BYTES
from affidavit.packs import _format as F
from affidavit.packs import export_pack, verify_pack
from affidavit.packs.verify import result_errors
from tests.packs.helpers import resign, run_job

app = load_commands()  # every command

runner = CliRunner()


def _export(make_runtime: Callable[..., Any], tmp_path: Path) -> Path:
    rt, job_id = run_job(make_runtime, "refund", tmp_path / "data")
    return export_pack(rt.store, job_id, tmp_path / "pack").pack_dir


def _first_trace(pack: Path) -> str:
    return f"{F.TRACES_DIR}/{sorted(p.name for p in (pack / F.TRACES_DIR).iterdir())[0]}"


def _repeat_first_key(text: str, value: Any = "repeated") -> tuple[str, str]:
    """``text`` (one JSON object) with its first key given once more, first, with ``value``:
    parsers keep the last, which is the original, so every hash of the parsed value holds."""
    key = next(iter(json.loads(text)))
    start = text.index("{") + 1
    return text[:start] + f"{json.dumps(key)}:{json.dumps(value)}," + text[start:], key


@pytest.mark.parametrize("where", ["trace", "contract", "manifest", "receipts", "events"])
def test_a_key_given_twice_is_integrity_fail_naming_file_and_key(
    make_runtime: Callable[..., Any], tmp_path: Path, where: str
) -> None:
    pack = _export(make_runtime, tmp_path)
    assert verify_pack(pack).verdict == "MATCH"
    name = {
        "trace": _first_trace(pack),
        "contract": F.CONTRACT,
        "manifest": F.MANIFEST,
        "receipts": F.RECEIPTS,
        "events": F.EVENTS,
    }[where]
    path = pack / name
    text = path.read_text()
    if where == "manifest":
        # a second signer key, first: the signature covers the parsed manifest (the last one)
        other = "A" * 43 + "="
        edited, key = text.replace("{", '{"signer_pubkey": "' + other + '",', 1), "signer_pubkey"
        described = name
    elif where in ("receipts", "events"):
        lines = text.splitlines()
        lines[0], key = _repeat_first_key(lines[0])
        edited, described = "\n".join(lines) + "\n", f"{name} line 1"
    else:
        edited, key = _repeat_first_key(text)
        described = name
    path.write_text(edited)
    if where == "events":  # (the manifest hashes the log: re-signed, phase 5 reads it)
        resign(pack)
    verdict = verify_pack(pack)
    assert verdict.verdict == "INTEGRITY_FAIL", verdict.errors
    assert f"{described}: key {key!r} appears twice in one object" in verdict.errors
    assert result_errors(verdict.receipt) == []


def test_a_key_given_twice_in_the_manifests_files_list(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path)
    manifest = pack / F.MANIFEST
    text = manifest.read_text()
    manifest.write_text(text.replace("{", '{"files": [],', 1))
    verdict = verify_pack(pack)
    assert verdict.verdict == "INTEGRITY_FAIL"
    assert f"{F.MANIFEST}: key 'files' appears twice in one object" in verdict.errors


def test_a_sparse_file_of_2_gib_is_refused_by_its_size_before_it_is_read(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path)
    name = _first_trace(pack)
    with open(pack / name, "r+b") as f:
        f.truncate(2 * 1024**3)  # sparse: no disk used
    tracemalloc.start()
    try:
        verdict = verify_pack(pack)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict.verdict == "INTEGRITY_FAIL"
    size = 2 * 1024**3
    message = (
        f"{name}: {size:,} bytes, more than the {DEFAULT_PACK_MAX_FILE_BYTES:,} a file of a "
        "pack may hold"
    )
    assert any(e.startswith(message) for e in verdict.errors), verdict.errors
    assert peak < 64 * 1024**2  # nothing of the 2 GiB was read


def test_the_bound_is_set_by_argument_option_or_environment(
    make_runtime: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = _export(make_runtime, tmp_path)
    largest = max(p.stat().st_size for p in pack.rglob("*") if p.is_file())
    assert verify_pack(pack, max_file_bytes=largest).verdict == "MATCH"
    small = verify_pack(pack, max_file_bytes=largest - 1)
    assert small.verdict == "INTEGRITY_FAIL"
    assert any(f"more than the {largest - 1:,} a file" in e for e in small.errors)

    monkeypatch.setenv("AFFIDAVIT_PACK_MAX_FILE_BYTES", str(largest - 1))
    assert verify_pack(pack).verdict == "INTEGRITY_FAIL"
    out = tmp_path / "out"
    raised = runner.invoke(
        app, ["pack", "verify", str(pack), "--out-dir", str(out), "--max-file-bytes", "99999999"]
    )
    assert raised.exit_code == 0, raised.output
    env = runner.invoke(app, ["pack", "verify", str(pack), "--out-dir", str(out), "--overwrite"])
    assert env.exit_code == 2 and "more than the" in env.output
    monkeypatch.setenv("AFFIDAVIT_PACK_MAX_FILE_BYTES", "big")
    bad = runner.invoke(app, ["pack", "verify", str(pack), "--out-dir", str(out), "--overwrite"])
    assert bad.exit_code == 3 and "AFFIDAVIT_PACK_MAX_FILE_BYTES='big'" in bad.output
    assert os.path.exists(out)
