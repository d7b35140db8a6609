"""Claims: their rules, how they are validated, and how a run is judged against them.

A claim is a JSON object. Its rules (each optional):

- ``return_code``: the exact exit status claimed (``1`` can be accurate);
- ``output_contains``: a string or a list of strings that must each occur, case-sensitively, in
  stdout or stderr;
- ``metrics``: ``{name: number}`` compared with the metrics the command reports, each within the
  relative ``tolerance`` (default 0.05, inclusive, relative to the claimed value); the metrics
  come from the ``parser`` (default ``json``: a JSON object on the last non-empty stdout line;
  ``pytest``: the summary counts; ``coverage``: the total percent);
- ``exact_match``: a JSON value equal (as canonical JSON) to what the command printed (its whole
  stdout as JSON, else its last non-empty line).

A claim with none of these is judged by the default rule: exit status 0. Besides rules a claim
may carry ``pattern_id`` (a linked learning pattern) and ``description`` (free text). Any other
key is refused, so that a misspelt rule cannot silently fall back to the default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.claims.sandbox import RunResult
from affidavit.core.canonical import canonical, parse
from affidavit.core.errors import CanonicalizationError, InvalidClaim

RULES = ("return_code", "output_contains", "metrics", "exact_match")
CLAIM_KEYS = frozenset((*RULES, "tolerance", "parser", "pattern_id", "description"))
PARSERS = ("json", "pytest", "coverage")
DEFAULT_TOLERANCE = 0.05
DEFAULT_RULE = "default"
# Inclusive comparison robust to the rounding of ``tolerance * claimed``.
_EPSILON = 1e-12

PYTEST_COUNTS = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
PYTEST_OTHER = ("warnings", "deselected", "rerun")
_PYTEST_ALIASES = {"error": "errors", "warning": "warnings"}
_PYTEST_SUMMARY = re.compile(r"(?:^|[\s=])((?:\d+ [a-z]+(?:, )?)+|no tests ran)\s+in\s+[\d.]+s\b")
_PYTEST_PAIR = re.compile(r"(\d+) ([a-z]+)")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?%?\Z")


@dataclass(frozen=True, slots=True)
class ClaimRules:
    """A validated claim."""

    content: Mapping[str, Any]
    return_code: int | None = None
    output_contains: tuple[str, ...] | None = None
    metrics: Mapping[str, float] | None = None
    tolerance: float = DEFAULT_TOLERANCE
    parser: str = "json"
    has_exact_match: bool = False
    exact_match: Any = None
    pattern_id: str | None = None

    @property
    def rules(self) -> tuple[str, ...]:
        present = {
            "return_code": self.return_code is not None,
            "output_contains": self.output_contains is not None,
            "metrics": self.metrics is not None,
            "exact_match": self.has_exact_match,
        }
        return tuple(rule for rule in RULES if present[rule])


def _invalid(message: str) -> InvalidClaim:
    return InvalidClaim(message)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (not isinstance(value, float) or math.isfinite(value))
    )


def parse_claim(content: Any) -> ClaimRules:
    """Validate ``content`` and return its rules.

    Raises:
        InvalidClaim: not a JSON object, an unknown key, or a malformed rule (the message
            names the key).
    """
    if not isinstance(content, Mapping):
        raise _invalid(f"a claim must be a JSON object, not {type(content).__name__}")
    try:
        canonical(content)
    except CanonicalizationError as exc:
        raise InvalidClaim(f"the claim is not representable as JSON: {exc.message}") from None
    unknown = sorted(set(content) - CLAIM_KEYS)
    if unknown:
        raise _invalid(f"unknown claim key(s) {unknown}; a claim may contain {sorted(CLAIM_KEYS)}")
    fields: dict[str, Any] = {"content": dict(content)}
    if "return_code" in content:
        rc = content["return_code"]
        if not isinstance(rc, int) or isinstance(rc, bool):
            raise _invalid(f"return_code must be an integer, not {rc!r}")
        fields["return_code"] = rc
    if "output_contains" in content:
        wanted = content["output_contains"]
        items = [wanted] if isinstance(wanted, str) else wanted
        if (
            not isinstance(items, list)
            or not items
            or not all(isinstance(s, str) and s for s in items)
        ):
            raise _invalid("output_contains must be a non-empty string or a list of them")
        fields["output_contains"] = tuple(items)
    if "metrics" in content:
        metrics = content["metrics"]
        if not isinstance(metrics, Mapping) or not metrics:
            raise _invalid("metrics must be a non-empty object of {name: number}")
        for name, value in metrics.items():
            if not _is_number(value):
                raise _invalid(f"metrics.{name} must be a finite number, not {value!r}")
        fields["metrics"] = {k: float(v) for k, v in metrics.items()}
    for key in ("tolerance", "parser"):
        if key in content and "metrics" not in content:
            raise _invalid(f"{key} applies to metrics, but the claim has no metrics")
    if "tolerance" in content:
        tolerance = content["tolerance"]
        if not _is_number(tolerance) or tolerance < 0:
            raise _invalid(f"tolerance must be a number ≥ 0, not {tolerance!r}")
        fields["tolerance"] = float(tolerance)
    if "parser" in content:
        if content["parser"] not in PARSERS:
            raise _invalid(f"parser must be one of {list(PARSERS)}, not {content['parser']!r}")
        fields["parser"] = content["parser"]
    if "exact_match" in content:
        fields["has_exact_match"] = True
        fields["exact_match"] = content["exact_match"]
    if "pattern_id" in content:
        pattern_id = content["pattern_id"]
        if not isinstance(pattern_id, str) or not 0 < len(pattern_id) <= 128:
            raise _invalid("pattern_id must be a string of 1–128 characters")
        fields["pattern_id"] = pattern_id
    if "description" in content and not isinstance(content["description"], str):
        raise _invalid("description must be a string")
    return ClaimRules(**fields)


# --- parsers ------------------------------------------------------------------------------


def _last_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return None


def _json(text: str) -> tuple[bool, Any]:
    try:
        value = parse(text)
        canonical(value)  # NaN, infinities: not JSON we can compare or record
    except (ValueError, CanonicalizationError):
        return False, None
    return True, value


def parse_json_output(segments: Sequence[str]) -> tuple[bool, Any]:
    """The JSON value a command printed: its whole stdout when complete and JSON, else its last
    non-empty line. ``(False, None)`` when there is none."""
    if len(segments) == 1:
        found, value = _json(segments[0])
        if found:
            return found, value
    last = _last_line(segments[-1])
    return (False, None) if last is None else _json(last)


def metrics_json(segments: Sequence[str]) -> dict[str, float] | None:
    """Numbers of the JSON object on the last non-empty stdout line."""
    last = _last_line(segments[-1])
    found, value = (False, None) if last is None else _json(last)
    if not found or not isinstance(value, dict):
        return None
    return {k: float(v) for k, v in value.items() if _is_number(v)}


def metrics_pytest(segments: Sequence[str]) -> dict[str, float] | None:
    """Counts from pytest's final summary line (``3 passed, 1 failed in 0.12s``); kinds not
    mentioned are 0; ``total`` is the sum of the outcome counts."""
    for line in reversed(segments[-1].splitlines()):
        match = _PYTEST_SUMMARY.search(line)
        if match is None:
            continue
        counts = dict.fromkeys((*PYTEST_COUNTS, *PYTEST_OTHER), 0.0)
        for number, word in _PYTEST_PAIR.findall(match.group(1)):
            key = _PYTEST_ALIASES.get(word, word)
            if key in counts:
                counts[key] += float(number)
        counts["total"] = sum(counts[k] for k in PYTEST_COUNTS)
        return counts
    return None


def metrics_coverage(segments: Sequence[str]) -> dict[str, float] | None:
    """``coverage``: the percent of the ``TOTAL`` row of ``coverage report`` (or the bare
    number printed by ``coverage report --format=total``)."""
    lines = [line.strip() for line in segments[-1].splitlines() if line.strip()]
    for line in reversed(lines):
        words = line.split()
        if words[0] == "TOTAL" and _NUMBER.match(words[-1]):
            return {"coverage": float(words[-1].rstrip("%"))}
    if lines and _NUMBER.match(lines[-1]):
        return {"coverage": float(lines[-1].rstrip("%"))}
    return None


PARSER_FUNCTIONS = {"json": metrics_json, "pytest": metrics_pytest, "coverage": metrics_coverage}


# --- judging ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on one claim: ``accurate``, ``inaccurate`` or ``error`` (no evidence either
    way), the rule that decided, and what the command actually did."""

    verdict: str
    decided_by: str
    actual: dict[str, Any]

    @property
    def accurate(self) -> bool:
        return self.verdict == "accurate"


def within(claimed: float, actual: float, tolerance: float) -> bool:
    """``|actual − claimed| ≤ tolerance · |claimed|``, inclusive (robust to the rounding of the
    product)."""
    diff, bound = abs(actual - claimed), tolerance * abs(claimed)
    return diff <= bound or math.isclose(diff, bound, rel_tol=1e-9)


def judge(rules: ClaimRules, run: RunResult) -> Judgement:
    """Compare a run with the claim. Every rule the claim contains is checked, in the order of
    :data:`RULES`; the verdict is accurate when all hold. ``decided_by`` is the first rule that
    failed, or all the rules that held joined by ``+`` (``default`` when the claim has none)."""
    actual: dict[str, Any] = {
        "return_code": run.return_code,
        "timed_out": run.timed_out,
        "duration_ms": round(run.duration_ms, 3),
        "stdout_truncated": run.stdout.truncated,
        "stderr_truncated": run.stderr.truncated,
    }
    if run.spawn_error is not None:
        actual["spawn_error"] = run.spawn_error
        return Judgement("error", "spawn_error", actual)
    if run.timed_out:
        return Judgement("error", "timeout", actual)
    out = run.stdout.segments()
    checks: list[dict[str, Any]] = []
    if rules.return_code is not None:
        checks.append(
            {
                "rule": "return_code",
                "ok": run.return_code == rules.return_code,
                "claimed": rules.return_code,
                "actual": run.return_code,
            }
        )
    if rules.output_contains is not None:
        texts = out + run.stderr.segments()
        missing = [s for s in rules.output_contains if not any(s in t for t in texts)]
        checks.append({"rule": "output_contains", "ok": not missing, "missing": missing})
    if rules.metrics is not None:
        reported = PARSER_FUNCTIONS[rules.parser](out)
        actual["metrics"] = reported
        failed = {}
        for name, claimed in rules.metrics.items():
            value = None if reported is None else reported.get(name)
            if value is None or not within(claimed, value, rules.tolerance):
                failed[name] = {"claimed": claimed, "actual": value}
        check: dict[str, Any] = {
            "rule": "metrics",
            "ok": not failed,
            "parser": rules.parser,
            "tolerance": rules.tolerance,
            "failed": failed,
        }
        if reported is None:
            check["reason"] = f"the {rules.parser} parser found no metrics in stdout"
        checks.append(check)
    if rules.has_exact_match:
        found, value = parse_json_output(out)
        actual["output"] = value
        same = found and canonical(value) == canonical(rules.exact_match)
        check = {"rule": "exact_match", "ok": same}
        if not found:
            check["reason"] = "the command printed no JSON"
        checks.append(check)
    if not checks:
        checks.append({"rule": DEFAULT_RULE, "ok": run.return_code == 0, "actual": run.return_code})
    actual["checks"] = checks
    for check in checks:
        if not check["ok"]:
            return Judgement("inaccurate", str(check["rule"]), actual)
    return Judgement("accurate", "+".join(str(c["rule"]) for c in checks), actual)
