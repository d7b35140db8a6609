"""Metrics parsed from real pytest and coverage runs on a tiny project made here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.store import Store
from tests.claims.conftest import make_service

CALC = """\
def add(a, b):
    return a + b


def unused(x):
    if x:
        return 1
    return 2
"""
# The sample project's own tests: 2 pass, 1 fails and 1 is skipped on purpose, so the
# pytest summary parser is checked on every count it reports.
TESTS = """\
import pytest

from calc import add


def test_add():
    assert add(2, 2) == 4


def test_add_negative():
    assert add(-1, 1) == 0


def test_wrong():
    assert add(2, 2) == 5


@pytest.mark.skip(reason="not yet")
def test_later():
    pass
"""


@pytest.fixture
def sample(store: Store, project: Path) -> ClaimService:
    (project / "calc.py").write_text(CALC)
    (project / "test_calc.py").write_text(TESTS)
    svc = make_service(store, project=project)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    return svc


def test_pytest_summary_counts(sample: ClaimService) -> None:
    command = "pytest -q -p no:cacheprovider"
    claim = {"metrics": {"passed": 2, "failed": 1, "skipped": 1}, "parser": "pytest"}
    result = sample.verify_claim("alice", "test_result", {**claim, "tolerance": 0}, command, "vera")
    assert result.accurate, result.actual
    assert result.actual["metrics"]["total"] == 4
    # The same run judged against an inflated claim.
    inflated = {"metrics": {"passed": 3, "failed": 0}, "parser": "pytest", "tolerance": 0}
    result = sample.verify_claim("alice", "test_result", inflated, command, "vera")
    assert (result.verdict, result.decided_by) == ("inaccurate", "metrics")
    # A claim of exit status 1 (a test failed) is accurate.
    result = sample.verify_claim("alice", "test_result", {"return_code": 1}, command, "vera")
    assert result.accurate


def test_coverage_total_percent(sample: ClaimService, project: Path) -> None:
    # The project is read-only to a claim: a run writes its data file in the scratch directory.
    run = "coverage run --data-file=/tmp/.coverage -m pytest -q -p no:cacheprovider"
    assert sample.verify_claim("alice", "test_result", {"return_code": 1}, run, "vera").accurate
    # The data a report reads is the project's own, made before the claim.
    subprocess.run(
        [str(Path(sys.executable).parent / "coverage"), "run", "-m", "pytest", "-q", "-p",
         "no:cacheprovider"],
        cwd=project, capture_output=True, check=False,
    )  # fmt: skip
    # calc.py: 6 statements, 3 run (the two defs and `return a + b`): 50 %.
    report = "coverage report --include=calc.py"
    claim = {"metrics": {"coverage": 50}, "parser": "coverage", "tolerance": 0}
    result = sample.verify_claim("alice", "code_quality", claim, report, "vera")
    assert result.accurate, result.actual
    claim = {"metrics": {"coverage": 90}, "parser": "coverage"}
    result = sample.verify_claim("alice", "code_quality", claim, report, "vera")
    assert (result.verdict, result.decided_by) == ("inaccurate", "metrics")
    assert result.actual["metrics"] == {"coverage": 50.0}
