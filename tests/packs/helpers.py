"""Real jobs to export, and the independent verifier (``assay rce-verify``) as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from affidavit import Runtime
from affidavit.examples import refund
from tests.verify.helpers import charge_tool, plan, tools

ASSAY = Path(sys.executable).parent / "assay"

# a → b (fails) → c ; a → e (independent of b, never started: the job ended first) ; d pure on a
FAILING = plan(
    {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": "${input.amount}"}},
    {"id": "b", "type": "tool", "tool": "declined", "args": {}, "depends_on": ["a"]},
    {"id": "c", "type": "tool", "tool": "charge", "args": {"amount": 3}, "depends_on": ["b"]},
    {"id": "e", "type": "tool", "tool": "charge", "args": {"amount": 5}, "depends_on": ["a"]},
)

JOB_KINDS = ("refund", "failed", "charges")


def failing_tools() -> Any:
    return tools(charge_tool("declined", fail=True))


def run_job(rt_factory: Any, kind: str, data_dir: Path) -> tuple[Runtime, str]:
    """A finished real job: ``refund`` (completed; pure and tool steps), ``failed`` (a failed
    tool step, a skipped dependent, a step that never ran), ``charges`` (two tool steps)."""
    if kind == "refund":
        rt = rt_factory(refund.TOOLS)
        refund.setup_shop(data_dir)
        job = rt.submit(refund.PLAN, {"order_id": "A-1001", "data_dir": str(data_dir)})
        rt.run_until_idle()
        assert rt.get_job(job.job_id).status == "completed"
        return rt, job.job_id
    if kind == "failed":
        rt = rt_factory(failing_tools())
        job = rt.submit(FAILING, {"amount": 4})
        rt.run_until_idle()
        assert rt.get_job(job.job_id).status == "failed"
        return rt, job.job_id
    rt = rt_factory(tools())
    two = plan(
        {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": "${input.amount}"}},
        {"id": "b", "type": "tool", "tool": "charge", "args": {"amount": 2}, "depends_on": ["a"]},
    )
    job = rt.submit(two, {"amount": 7})
    rt.run_until_idle()
    assert rt.get_job(job.job_id).status == "completed"
    return rt, job.job_id


def assay_verify(pack: Path, out: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Run ``assay rce-verify``; its exit code, replay-result receipt and details."""
    proc = subprocess.run(
        [str(ASSAY), "rce-verify", str(pack), "--out-dir", str(out), "--overwrite"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HOME": str(out.parent)},  # assay keeps a keystore under ~/.assay
    )
    result_path = out / "rce_replay_result.json"
    if not result_path.exists():
        return proc.returncode, {"crash": proc.stderr[-2000:]}, {}
    result = json.loads(result_path.read_text())
    details = json.loads((out / "rce_replay_details.json").read_text())
    return proc.returncode, result, details


def resign(pack: Path) -> None:
    """Re-hash every file the pack's manifest lists and sign the manifest again with this
    test's seal key — what the holder of the key could do after editing a file of the pack
    (phase 5 must still catch an edited log: the job's seal does not move with it)."""
    import base64

    from affidavit.core.canonical import canonical
    from affidavit.packs import _format as F
    from affidavit.record._sealing import SigningKey

    key = SigningKey.load(Path(os.environ["AFFIDAVIT_SIGNING_KEY"]))
    manifest = json.loads((pack / F.MANIFEST).read_text())
    for entry in manifest["files"]:
        data = (pack / entry["path"]).read_bytes()
        entry.update(sha256=F.sha256_hex(data), bytes=len(data))
    unsigned = {k: v for k, v in manifest.items() if k not in F.MANIFEST_UNSIGNED}
    signature = key.private.sign(canonical(unsigned))
    manifest["signature"] = base64.b64encode(signature).decode("ascii")
    (pack / F.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    (pack / F.SIGNATURE).write_bytes(signature)
