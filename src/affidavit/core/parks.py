"""Why a job is parked, and which decisions of ``affidavit resume`` resolve each kind of park.

A format table (docs/formats.md §3, ``job_parked`` and ``job_resumed``): the runtime writes parks
and checks decisions against it, the verifier checks a log's decisions against it, the CLI and
the API list a parked job's choices from it.
"""

from __future__ import annotations

# Which decisions resolve which kind of park (a reason not listed: only ``fail``).
DECISIONS_BY_REASON: dict[str, tuple[str, ...]] = {
    "in_flight": ("retry", "accept_result", "fail"),
    "replay_verification": ("continue", "fail"),
    "crash_loop": ("retry", "fail"),
    "nondeterministic": ("retry", "fail"),
    "budget_exceeded": ("continue", "fail"),
}
# Every decision ``resume`` knows.
RESUME_DECISIONS = ("retry", "accept_result", "continue", "fail")

__all__ = ["DECISIONS_BY_REASON", "RESUME_DECISIONS"]
