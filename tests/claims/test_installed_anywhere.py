"""Claims work wherever the installation lives: a virtualenv under /tmp (a fresh clone there,
its ``.venv`` inside) is bound over the jail's private /tmp, so its interpreter and tools start.
The service runs as a real subprocess of that virtualenv's interpreter, on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import affidavit
from affidavit.claims import ClaimService
from affidavit.store import Store
from tests.claims.conftest import make_service

DRIVER = """
import json, sys
from affidavit.claims import ClaimService, SandboxConfig
from affidavit.store import open_store

store = open_store(sys.argv[1])
svc = ClaimService(store, sandbox=SandboxConfig(project_dir=sys.argv[2]))
svc.add_agent("alice", namespace="team")
svc.add_agent("vera", namespace="team")
cases = [
    ("test_result", {"metrics": {"passed": 2, "failed": 1}, "parser": "pytest", "tolerance": 0},
     "pytest -q -p no:cacheprovider"),
    ("test_result", {"return_code": 1},
     "coverage run --data-file=/tmp/.coverage -m pytest -q -p no:cacheprovider"),
    ("code_quality", {"metrics": {"score": 7}, "parser": "json", "tolerance": 0},
     "python metric.py"),
    ("custom", {"output_contains": sys.prefix}, "python show_prefix.py"),
]
out = []
for kind, claim, command in cases:
    result = svc.verify_claim("alice", kind, claim, command, "vera")
    evidence = svc.get_evidence(result.verification_id)
    out.append({"command": command, "verdict": result.verdict, "spawn_error":
                evidence["spawn_error"], "stderr": evidence["stderr"]["excerpt"][-800:]})
print(json.dumps({"prefix": sys.prefix, "results": out}))
"""
TESTS = """def test_one():
    assert 1 + 1 == 2


def test_two():
    assert "a" in "abc"


def test_three():
    assert False
"""


def _script(venv: Path, name: str, module: str) -> None:
    path = venv / "bin" / name
    path.write_text(
        f"#!{venv}/bin/python\nimport sys\nfrom {module} import main\nsys.exit(main())\n"
    )
    path.chmod(0o755)


@pytest.fixture
def tmp_venv(tmp_path: Path) -> Path:
    """A virtualenv under /tmp whose site-packages point (by a .pth file) at this checkout's
    source and its tools, with `pytest` and `coverage` scripts of its own, as pip makes them."""
    venv = tmp_path / "clone" / ".venv"
    assert str(venv).startswith("/tmp/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    source = Path(affidavit.__file__).resolve().parent.parent
    [packages] = (venv / "lib").glob("python3*/site-packages")
    # This interpreter's whole import path outside its base Python (however it was installed)
    imports = [p for p in sys.path if p and os.path.isdir(p) and sys.base_prefix not in p]
    (packages / "outer.pth").write_text("\n".join([str(source), *imports]) + "\n")
    _script(venv, "pytest", "pytest")
    _script(venv, "coverage", "coverage.cmdline")
    return venv


def test_a_virtualenv_under_tmp_runs_claims_in_the_jail(
    store_url: str, tmp_venv: Path, tmp_path: Path
) -> None:
    project = tmp_path / "clone" / "project"
    project.mkdir()
    (project / "test_calc.py").write_text(TESTS)
    (project / "metric.py").write_text('import json\nprint(json.dumps({"score": 7}))\n')
    (project / "show_prefix.py").write_text("import sys\nprint(sys.prefix)\n")
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "drive.py").write_text(DRIVER)
    ran = subprocess.run(
        [str(tmp_venv / "bin" / "python"), str(driver / "drive.py"), store_url, str(project)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout.strip().splitlines()[-1])
    assert doc["prefix"] == str(tmp_venv)
    for result in doc["results"]:
        assert result["spawn_error"] is None, result
        assert result["verdict"] == "accurate", result


def test_a_program_that_cannot_start_says_why(store: Store, tmp_path: Path) -> None:
    # Found on the search path, but its interpreter (the #! line) is nowhere: the evidence
    # says so, and the claim is an error, not a verdict.
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "true").write_text("#!/nonexistent/python\nprint('never')\n")
    (tools / "true").chmod(0o755)
    svc: ClaimService = make_service(store, search_path=f"{tools}:/usr/bin:/bin")
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    result = svc.verify_claim("alice", "custom", {"return_code": 0}, "true", "vera")
    assert (result.verdict, result.decided_by) == ("error", "spawn_error")
    evidence = svc.get_evidence(result.verification_id)
    assert evidence is not None and evidence["return_code"] is None
    reason = evidence["spawn_error"]
    assert "No such file or directory" in reason and str(tools / "true") in reason
    assert "its interpreter '/nonexistent/python' (its #! line) does not exist" in reason
    assert svc.get_agent("alice").trust_score == 0.5
