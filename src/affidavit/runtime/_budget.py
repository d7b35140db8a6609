"""An agent job's budget at run time: what the job spent (from its log, then from this run's
calls and recorded usage), checked before each new call (see :mod:`affidavit.core.budget`).

The call that would exceed the budget does not run: the job parks as ``budget_exceeded`` with
what it spent, before the call is recorded. ``affidavit resume JOB --decision continue
--budget JSON`` records a new budget (absolute) in its ``job_resumed``; ``fail`` ends the job.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from affidavit.core.budget import Budget, Spent, exceeded_by_call
from affidavit.store import StoredEvent

_CALL_KINDS = ("tool", "pure")


class BudgetMeter:
    """The budget in force for one run of one agent job and what the job spent; shared by the
    run's concurrent calls."""

    def __init__(self, budget: Budget, spent: Spent) -> None:
        self.budget = budget
        self.spent = spent
        self._lock = threading.Lock()

    @classmethod
    def of_log(
        cls, events: Iterable[StoredEvent], started: Mapping[str, Any]
    ) -> BudgetMeter | None:
        """The meter of a job whose ``agent_started`` payload is ``started`` and whose log is
        ``events``; ``None`` for a job without a budget."""
        recorded = started.get("budget")
        if recorded is None:
            return None
        budget, spent = Budget.from_dict(recorded), Spent()
        for e in events:
            if e.type == "step_called":
                if e.payload.get("kind") in _CALL_KINDS:
                    spent.tool_calls += 1
            elif e.type == "node_finished":
                spent.add_usage(e.payload.get("usage"))
            elif e.type == "job_resumed" and e.payload.get("budget") is not None:
                budget = Budget.from_dict(e.payload["budget"])
        return cls(budget, spent)

    def admit(self) -> str | None:
        """Count one more call if the budget allows it; else why not (nothing counted)."""
        with self._lock:
            reason = exceeded_by_call(self.budget, self.spent)
            if reason is None:
                self.spent.tool_calls += 1
            return reason

    def used(self, usage: Mapping[str, Any]) -> None:
        """Add a recorded step's usage."""
        with self._lock:
            self.spent.add_usage(usage)

    def detail(self, reason: str, kind: str, tool_name: str | None) -> dict[str, Any]:
        """The ``job_parked`` detail of a call the budget stopped."""
        with self._lock:
            return {
                "message": f"budget exceeded: {reason}; the {kind} call {tool_name!r} did not run",
                "budget": self.budget.to_dict(),
                "spent": self.spent.to_dict(),
                "call": {"kind": kind, "tool_name": tool_name},
            }
