"""The progress lines of ``affidavit run`` for the events other than a plain finished step."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from affidavit.cli.progress import describe, job_line
from affidavit.core.canonical import canonical
from affidavit.store import StoredEvent


def event(kind: str, payload: Any) -> StoredEvent:
    return StoredEvent("job-1", 3, "e-1", kind, canonical(payload), "00" * 32)


def plain(markup: str | None) -> str | None:
    if markup is None:
        return None
    console = Console(width=200, no_color=True)
    with console.capture() as captured:
        console.print(markup, highlight=False, end="")
    return captured.get()


@pytest.mark.parametrize(
    ("kind", "payload", "line"),
    [
        ("node_finished", {"node_id": "pay", "result_type": "side_effect_committed",
                           "duration_ms": 1234.4}, "  ✓ pay committed (1,234 ms)"),
        ("node_finished", {"node_id": "pay", "result_type": "permanent_failure",
                           "error": {"type": "ValueError", "message": "card [declined]"}},
         "  ✗ pay failed: card [declined]"),
        ("tool_invocation_finished", {"node_id": "pay", "outcome": "success", "catch_up": True},
         "  ↺ pay recovered an invocation left open: the effect had happened"),
        ("tool_invocation_finished", {"node_id": "pay", "outcome": "lost", "catch_up": True},
         "  ↺ pay recovered an invocation left open: it had not"),
        ("tool_invocation_finished", {"node_id": "pay", "outcome": "success", "catch_up": False},
         None),
        ("job_waiting", {"node_id": "ok", "reason": "approval node 'ok'"},
         "  … ok waits: approval node 'ok'"),
        ("job_parked", {"node_id": "pay", "reason": "in_flight", "detail": "no reconcile"},
         "  ‖ parked at pay: in_flight (no reconcile)"),
        ("job_parked", {"node_id": "w", "reason": "replay_verification",
                        "detail": {"mismatches": [{"reason": "r changed", "node_id": "w"}]}},
         "  ‖ parked at w: replay_verification (r changed)"),
        ("job_parked", {"node_id": "w", "reason": "in_flight", "detail": {"tool_name": "pay"}},
         "  ‖ parked at w: in_flight"),
        ("step_compensated", {"node_id": "pay"}, "  ↺ pay compensation ran"),
        ("node_started", {"node_id": "pay"}, None),
        ("job_created", ["not", "an", "object"], None),
    ],
)  # fmt: skip
def test_describe(kind: str, payload: Any, line: str | None) -> None:
    assert plain(describe(event(kind, payload))) == line


def test_job_line() -> None:
    assert plain(job_line("j-1", "parked", 2.345)) == "job j-1: parked (2.35 s)"


def test_a_payload_that_is_not_json_shows_nothing() -> None:
    broken = StoredEvent("job-1", 3, "e-1", "node_finished", b'{"node_id": "pay"', "00" * 32)
    assert describe(broken) is None
