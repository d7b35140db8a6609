"""A claim's type says which programs can prove it (affidavit.claims.kinds): a test_result
claim runs a test runner; a metric claim is never proven by a program that prints what it is
given. Refused before anything runs or is written, on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.claims.kinds import CommandUnfitForClaim, measures, runs_tests
from affidavit.claims.sandbox import DEFAULT_ALLOWED_PROGRAMS
from affidavit.core.errors import CommandNotAllowed
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded

# every program these tests name is allowed, so only the claim type can refuse them
PRINTERS = DEFAULT_ALLOWED_PROGRAMS | {"printf", "head", "tail"}


@pytest.fixture
def lenient(store: Store, project: Path) -> ClaimService:
    """Inline code and the printing utilities allowed; a project with a metrics file."""
    (project / "metrics.json").write_text('{"p95_ms": 50}\n')
    (project / "bench.py").write_text("print('{\"p95_ms\": 50}')\n")
    (project / "test_ok.py").write_text(
        "import unittest\n\n\nclass Ok(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    )
    svc = make_service(store, project=project, allowed_programs=PRINTERS, allow_inline_code=True)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    return svc


SELF_PRINTING = [
    "echo '{\"p95_ms\": 50}'",
    "printf '{\"p95_ms\": 50}\\n'",
    "cat metrics.json",
    "head -n 1 metrics.json",
    "tail -n 1 metrics.json",
    'python -c \'print("{\\"p95_ms\\": 50}")\'',
    "python3 -I -c 'print(1)'",
    "ls",
]


@pytest.mark.parametrize("command", SELF_PRINTING)
@pytest.mark.parametrize("kind", ["performance_metric", "custom", "code_quality"])
def test_a_metric_claim_is_not_proven_by_a_program_that_prints_it(
    lenient: ClaimService, command: str, kind: str
) -> None:
    claim = {"metrics": {"p95_ms": 50}}
    with pytest.raises(CommandUnfitForClaim, match="cannot be proven by") as caught:
        lenient.verify_claim("alice", kind, claim, command, "vera")
    assert isinstance(caught.value, CommandNotAllowed)  # exit 5, HTTP 422
    assert caught.value.code == "command_unfit_for_claim" and caught.value.hint
    with pytest.raises(CommandUnfitForClaim):
        lenient.make_claim("alice", kind, claim, command)
    assert nothing_recorded(lenient)


def test_a_performance_claim_without_metrics_is_still_not_proven_by_echo(
    lenient: ClaimService,
) -> None:
    with pytest.raises(CommandUnfitForClaim, match="performance_metric"):
        lenient.verify_claim(
            "alice", "performance_metric", {"output_contains": "50"}, "echo 50", "vera"
        )
    assert nothing_recorded(lenient)


def test_a_metric_claim_measured_by_the_projects_code_is_judged(lenient: ClaimService) -> None:
    result = lenient.verify_claim(
        "alice", "performance_metric", {"metrics": {"p95_ms": 50}}, "python bench.py", "vera"
    )
    assert result.accurate and result.actual["metrics"] == {"p95_ms": 50.0}


NOT_TEST_RUNNERS = [
    "true",
    "echo 3 passed",
    "cat test_ok.py",
    "python bench.py",
    "python -c 'print(1)'",
    "coverage run bench.py",
    "coverage report",
    "pytest --version",
    "python -m pytest --help",
    "pytest --collect-only -q",
    "ruff check .",
]


@pytest.mark.parametrize("command", NOT_TEST_RUNNERS)
def test_a_test_result_claim_must_run_a_test_runner(lenient: ClaimService, command: str) -> None:
    with pytest.raises(CommandUnfitForClaim, match="must run a test runner") as caught:
        lenient.verify_claim("alice", "test_result", {"return_code": 0}, command, "vera")
    assert "pytest" in caught.value.hint
    with pytest.raises(CommandUnfitForClaim):
        lenient.make_claim("alice", "test_result", {"return_code": 0}, command)
    assert nothing_recorded(lenient)


@pytest.mark.parametrize(
    "command",
    [
        "pytest -q -p no:cacheprovider test_ok.py",
        "python -m pytest -q -p no:cacheprovider test_ok.py",
        "python3 -I -m pytest -q -p no:cacheprovider test_ok.py",
        "python -m unittest -q",
        "coverage run --data-file /tmp/.coverage -m pytest -q -p no:cacheprovider test_ok.py",
    ],
)
def test_a_test_result_claim_run_by_a_test_runner_is_judged(
    lenient: ClaimService, command: str
) -> None:
    result = lenient.verify_claim("alice", "test_result", {"return_code": 0}, command, "vera")
    assert result.verdict == "accurate", result.actual


def test_the_rules_read_the_words_as_the_programs_do() -> None:
    assert runs_tests(["python", "-Im", "pytest"]) and runs_tests(["python", "-mpytest"])
    assert runs_tests(["python", "-X", "dev", "-m", "unittest"])
    assert not runs_tests(["python", "-X", "-m", "x.py"])  # -X takes "-m" as its value
    assert not runs_tests(["python", "-m", "pip", "list"])
    assert not runs_tests(["coverage", "report", "-m", "pytest"])  # not `coverage run`
    assert measures(["python", "-W", "ignore", "bench.py"]) and measures(["mypy", "."])
    assert not measures(["python"]) and not measures(["python", "-"])  # stdin is /dev/null
    assert not measures(["python", "-m", "pip", "list"]) and not measures(["pwd"])
