"""A fork's proof pack on both backends: alone, it verifies MATCH (here and in assay's
``rce-verify``) and says its reused steps' source was not checked; with ``--source`` (the
source's pack) the prefix is checked against it, and a pack that is not the source, or a
source re-sealed since the fork, is INTEGRITY_FAIL."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from affidavit import Runtime
from affidavit.packs import export_pack
from affidavit.packs.verify import verify_pack
from tests.cli.test_cli import cli, json_of
from tests.packs.helpers import assay_verify
from tests.runtime.conftest import calls  # noqa: F401 (a fixture)
from tests.runtime.helpers import Calls
from tests.runtime.test_fork import FIVE, _source, make_runtime  # noqa: F401 (a fixture)
from tests.verify.helpers import reseal_v1


def _packs(
    make_runtime: Callable[..., Runtime],  # noqa: F811
    calls: Calls,  # noqa: F811
    tmp_path: Path,
) -> tuple[Runtime, str, Path, Path]:
    rt, source = _source(make_runtime, calls)
    fork = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    assert rt.store.get_job(fork).status == "completed"
    export_pack(rt.store, source, tmp_path / "source")
    export_pack(rt.store, fork, tmp_path / "fork")
    return rt, source, tmp_path / "source", tmp_path / "fork"


def test_a_fork_pack_alone_says_its_source_was_not_checked(
    make_runtime: Callable[..., Runtime],  # noqa: F811
    calls: Calls,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, source, _, fork = _packs(make_runtime, calls, tmp_path)
    verdict = verify_pack(fork)
    assert verdict.verdict == "MATCH", verdict.errors
    found = verdict.details["fork"]
    assert (found["source_job_id"], found["step"], found["status"]) == (source, "s3", "unverified")
    assert found["reason"].startswith("source not checked")
    code, result, _ = assay_verify(fork, tmp_path / "assay")
    assert code == 0 and result.get("verdict") == "MATCH", result
    shown = cli("pack", "verify", str(fork), "--out-dir", str(tmp_path / "v"))
    assert shown.returncode == 0, shown.stdout
    assert f"fork of job {source} up to step s3: unverified — source not checked" in shown.stdout
    assert "fork" not in verify_pack(tmp_path / "source").details  # no fork, nothing said


def test_a_fork_pack_checked_against_its_source_pack(
    make_runtime: Callable[..., Runtime],  # noqa: F811
    calls: Calls,  # noqa: F811
    tmp_path: Path,
) -> None:
    rt, source, source_pack, fork = _packs(make_runtime, calls, tmp_path)
    checked = verify_pack(fork, fork_source=source_pack)
    assert checked.verdict == "MATCH", checked.errors
    assert checked.details["fork"]["status"] == "verified"
    done = cli("pack", "verify", str(fork), "--source", str(source_pack),
               "--out-dir", str(tmp_path / "v"), "--json")  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert json_of(done)["fork"]["status"] == "verified"
    # another job's pack is not the source
    other = rt.submit(FIVE, {"amount": 3}).job_id
    rt.run_until_idle()
    export_pack(rt.store, other, tmp_path / "other")
    wrong = verify_pack(fork, fork_source=tmp_path / "other")
    assert wrong.verdict == "INTEGRITY_FAIL"
    assert wrong.details["fork"]["status"] == "failed"
    assert "not the source" in wrong.details["fork"]["problem"]
    # the source re-sealed since the fork was made: not the seal the fork recorded
    reseal_v1(rt.store.url, source)
    export_pack(rt.store, source, tmp_path / "resealed")
    resealed = verify_pack(fork, fork_source=tmp_path / "resealed")
    assert resealed.verdict == "INTEGRITY_FAIL"
    assert "seal hash" in resealed.details["fork"]["problem"]
    refused = cli("pack", "verify", str(fork), "--source", str(tmp_path / "resealed"),
                  "--out-dir", str(tmp_path / "v2"))  # fmt: skip
    assert refused.returncode == 2 and "fork: " in refused.stdout
