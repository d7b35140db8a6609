"""The comparison rules, each branch, judged on real runs through the service (both backends),
and the claim validation that refuses malformed rules before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from affidavit.claims import ClaimService
from affidavit.claims.compare import (
    metrics_coverage,
    metrics_json,
    metrics_pytest,
    parse_claim,
    within,
)
from affidavit.core.errors import ValidationError
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded


def verdict(svc: ClaimService, claim: dict[str, Any], command: str) -> tuple[str, str]:
    result = svc.verify_claim("alice", "custom", claim, command, "vera")
    return result.verdict, result.decided_by


# A project program that prints its arguments: a claim with metrics is never proven by `echo`
# (affidavit.claims.kinds), so the rules for metrics are judged on this one's output.
SAY = 'import sys\nprint(" ".join(sys.argv[1:]))\n'


@pytest.fixture
def said(store: Store, project: Path) -> ClaimService:
    """A service whose project holds ``say.py``, with alice and vera."""
    (project / "say.py").write_text(SAY)
    svc = make_service(store, project=project)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    return svc


@pytest.mark.parametrize(
    ("claim", "command", "expected"),
    [
        # return_code: exactly as claimed, 1 included
        ({"return_code": 1}, "false", ("accurate", "return_code")),
        ({"return_code": 0}, "false", ("inaccurate", "return_code")),
        ({"return_code": 0}, "true", ("accurate", "return_code")),
        ({"return_code": 2}, "ls /nonexistent-affidavit-path", ("accurate", "return_code")),
        # default: no rule at all means exit status 0
        ({}, "true", ("accurate", "default")),
        ({}, "false", ("inaccurate", "default")),
        ({"description": "just runs"}, "false", ("inaccurate", "default")),
        # output_contains: a string or a list, case-sensitive, stdout or stderr
        ({"output_contains": "PASSED"}, "echo 3 PASSED", ("accurate", "output_contains")),
        ({"output_contains": "passed"}, "echo 3 PASSED", ("inaccurate", "output_contains")),
        (
            {"output_contains": ["3", "PASSED"]},
            "echo 3 PASSED",
            ("accurate", "output_contains"),
        ),
        (
            {"output_contains": ["3", "FAILED"]},
            "echo 3 PASSED",
            ("inaccurate", "output_contains"),
        ),
        (
            {"output_contains": "No such file"},
            "ls /nonexistent-affidavit-path",
            ("accurate", "output_contains"),
        ),
        # the first failing rule decides; all holding rules are named when accurate
        (
            {"return_code": 0, "output_contains": "hello"},
            "echo hello",
            ("accurate", "return_code+output_contains"),
        ),
        (
            {"return_code": 1, "output_contains": "hello"},
            "echo hello",
            ("inaccurate", "return_code"),
        ),
        (
            {"return_code": 0, "output_contains": "bye"},
            "echo hello",
            ("inaccurate", "output_contains"),
        ),
        # metrics from the JSON object on the last non-empty line, relative tolerance
        (
            {"metrics": {"latency_ms": 50}},
            'echo \'{"latency_ms": 52.4, "note": "x"}\'',
            ("accurate", "metrics"),
        ),
        (
            {"metrics": {"latency_ms": 50}},
            "echo '{\"latency_ms\": 52.6}'",
            ("inaccurate", "metrics"),
        ),
        (
            {"metrics": {"latency_ms": 50}, "tolerance": 0.1},
            "echo '{\"latency_ms\": 55}'",  # exactly at the bound: inclusive
            ("accurate", "metrics"),
        ),
        (
            {"metrics": {"latency_ms": 50}, "tolerance": 0},
            "echo '{\"latency_ms\": 50.0}'",
            ("accurate", "metrics"),
        ),
        (
            {"metrics": {"latency_ms": 50}, "tolerance": 0},
            "echo '{\"latency_ms\": 50.01}'",
            ("inaccurate", "metrics"),
        ),
        (
            {"metrics": {"latency_ms": 50}},
            "echo '{\"other\": 50}'",  # not reported: not substantiated
            ("inaccurate", "metrics"),
        ),
        ({"metrics": {"latency_ms": 50}}, "echo no json here", ("inaccurate", "metrics")),
        # exact_match against the parsed output, as canonical JSON
        (
            {"exact_match": {"status": "success", "count": 42}},
            'echo \'{"count": 42, "status": "success"}\'',
            ("accurate", "exact_match"),
        ),
        (
            {"exact_match": {"status": "success", "count": 42}},
            'echo \'{"count": 41, "status": "success"}\'',
            ("inaccurate", "exact_match"),
        ),
        ({"exact_match": True}, "echo 1", ("inaccurate", "exact_match")),  # true is not 1
        ({"exact_match": [1, "a"]}, "echo '[1, \"a\"]'", ("accurate", "exact_match")),
        ({"exact_match": {"a": 1}}, "echo not json", ("inaccurate", "exact_match")),
    ],
)
def test_rules(
    said: ClaimService, claim: dict[str, Any], command: str, expected: tuple[str, str]
) -> None:
    if "metrics" in claim:
        command = command.replace("echo ", "python say.py ", 1)
    assert verdict(said, claim, command) == expected


def test_exact_match_uses_the_last_line_when_stdout_is_not_one_json_value(
    store: Store, project: Path
) -> None:
    (project / "emit.py").write_text('print("progress...")\nprint(\'{"ok": true}\')\n')
    svc = make_service(store, project=project)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    assert verdict(svc, {"exact_match": {"ok": True}}, "python emit.py") == (
        "accurate",
        "exact_match",
    )


def test_result_carries_the_checks_and_the_actual_output(said: ClaimService) -> None:
    result = said.verify_claim(
        "alice",
        "performance_metric",
        {"metrics": {"rps": 100, "p95": 20}, "tolerance": 0.05},
        'python say.py \'{"rps": 104, "p95": 30}\'',
        "vera",
    )
    assert not result.accurate
    assert result.decided_by == "metrics"
    assert result.actual["metrics"] == {"rps": 104.0, "p95": 30.0}
    (check,) = result.actual["checks"]
    assert check["failed"] == {"p95": {"claimed": 20.0, "actual": 30.0}}
    assert result.actual["return_code"] == 0


@pytest.mark.parametrize(
    ("claim", "fragment"),
    [
        ([1], "JSON object"),
        ({"return_cod": 0}, "unknown claim key"),
        ({"return_code": "0"}, "return_code must be an integer"),
        ({"return_code": True}, "return_code must be an integer"),
        ({"output_contains": []}, "output_contains"),
        ({"output_contains": ""}, "output_contains"),
        ({"output_contains": ["a", 3]}, "output_contains"),
        ({"metrics": {}}, "metrics must be"),
        ({"metrics": {"x": "1"}}, "metrics.x"),
        ({"metrics": {"x": True}}, "metrics.x"),
        ({"metrics": {"x": 1}, "tolerance": -0.1}, "tolerance"),
        ({"tolerance": 0.1}, "applies to metrics"),
        ({"metrics": {"x": 1}, "parser": "junit"}, "parser must be"),
        ({"pattern_id": 7}, "pattern_id"),
        ({"description": 1}, "description"),
        ({"metrics": {"x": float("nan")}}, "not representable"),
    ],
)
def test_malformed_claims_are_refused_before_running(
    svc: ClaimService, claim: Any, fragment: str, project: Path
) -> None:
    marker = project / "ran"
    with pytest.raises(ValidationError, match=fragment):
        svc.verify_claim("alice", "test_result", claim, f"ls {marker}", "vera")
    assert nothing_recorded(svc)


def test_unknown_claim_type_is_a_validation_error(svc: ClaimService) -> None:
    with pytest.raises(ValidationError, match="unknown claim type 'opinion'") as info:
        svc.verify_claim("alice", "opinion", {}, "true", "vera")
    assert info.value.code == "invalid_claim"
    assert nothing_recorded(svc)


def test_every_claim_type_is_accepted(said: ClaimService, project: Path) -> None:
    (project / "test_ok.py").write_text("def test_ok():\n    pass\n")
    for kind, command in (
        ("test_result", "pytest -q -p no:cacheprovider test_ok.py"),
        ("performance_metric", "python say.py '{}'"),
        ("code_quality", "true"),
        ("security_finding", "true"),
        ("deployment_status", "true"),
        ("custom", "true"),
    ):
        assert said.verify_claim("alice", kind, {}, command, "vera").accurate, kind
    stats = said.get_verification_statistics("alice")
    assert stats["total_verifications"] == 6
    assert len(stats["by_claim_type"]) == 6


# --- parsers and helpers (pure) ---------------------------------------------------------------


def test_tolerance_is_relative_to_the_claim_and_inclusive() -> None:
    assert within(100.0, 95.0, 0.05) and within(100.0, 105.0, 0.05)
    assert not within(100.0, 94.99, 0.05)
    assert within(0.0, 0.0, 0.05) and not within(0.0, 1e-9, 0.05)
    assert within(-10.0, -10.5, 0.05) and not within(-10.0, -11.0, 0.05)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "=================== 3 passed, 1 failed, 2 skipped in 0.12s ===================",
            {"passed": 3, "failed": 1, "skipped": 2, "total": 6},
        ),
        ("1 failed, 2 passed, 1 warning in 0.03s", {"passed": 2, "failed": 1, "warnings": 1}),
        ("2 passed, 1 error in 1.50s", {"passed": 2, "errors": 1, "total": 3}),
        ("== 1 passed, 2 xfailed, 1 xpassed, 3 deselected in 0.1s ==", {"xfailed": 2, "total": 4}),
        ("no tests ran in 0.01s", {"total": 0, "passed": 0}),
    ],
)
def test_pytest_summary_parser(line: str, expected: dict[str, float]) -> None:
    parsed = metrics_pytest(["collected 3 items\n\n" + line + "\n"])
    assert parsed is not None
    for key, value in expected.items():
        assert parsed[key] == value, key


def test_parsers_report_nothing_when_there_is_nothing() -> None:
    assert metrics_pytest(["hello\n"]) is None
    assert metrics_coverage(["hello\n"]) is None
    assert metrics_json(["\n\n"]) is None
    assert metrics_json(["[1, 2]\n"]) is None  # not an object
    assert metrics_json(['{"a": true, "b": "x", "c": 2}\n']) == {"c": 2.0}


def test_coverage_parser_reads_the_total_row_or_a_bare_total() -> None:
    report = "Name    Stmts   Miss  Cover\n---\n"
    report += "calc.py     6      3    50%\nTOTAL       6      3    50%\n"
    assert metrics_coverage([report]) == {"coverage": 50.0}
    assert metrics_coverage(["TOTAL  10  1  4  1  85.71%\n"]) == {"coverage": 85.71}
    assert metrics_coverage(["83\n"]) == {"coverage": 83.0}


def test_parse_claim_keeps_the_rules_in_order() -> None:
    rules = parse_claim({"exact_match": None, "return_code": 3, "output_contains": "x"})
    assert rules.rules == ("return_code", "output_contains", "exact_match")
    assert rules.has_exact_match and rules.exact_match is None


WORDS = {
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "deselected": "deselected",
}


@given(
    counts=st.dictionaries(st.sampled_from([*WORDS, "errors", "warnings"]), st.integers(1, 10_000)),
    seconds=st.floats(0, 1000, allow_nan=False).map(lambda x: round(x, 2)),
    banner=st.booleans(),
)
def test_pytest_parser_reads_back_any_summary(
    counts: dict[str, int], seconds: float, banner: bool
) -> None:
    def word(key: str, n: int) -> str:
        if key in ("errors", "warnings"):
            return key if n != 1 else key[:-1]
        return key

    parts = ", ".join(f"{n} {word(k, n)}" for k, n in counts.items()) or "no tests ran"
    line = f"{parts} in {seconds}s"
    if banner:
        line = f"{'=' * 10} {line} {'=' * 10}"
    parsed = metrics_pytest(["....\n" + line + "\n"])
    assert parsed is not None
    for key in (*WORDS, "errors", "warnings"):
        assert parsed[key] == counts.get(key, 0), key
    outcomes = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
    assert parsed["total"] == sum(counts.get(k, 0) for k in outcomes)
