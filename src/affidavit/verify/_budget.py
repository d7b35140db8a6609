"""The budget of one agent job's log, checked offline (invariant ``budget``).

What a log verified ✓ proves about its budget (``budget`` in ``agent_started``, replaced by
the ``budget`` of a ``job_resumed`` continuing a ``budget_exceeded`` park; see
:mod:`affidavit.core.budget`): no call ran past the budget in force when it was called — at
each ``step_called`` of a tool or pure call, the calls so far (with it) are at most
``tool_calls``, and the tokens and cost its steps' ``node_finished`` recorded before it are
below ``model_tokens`` and ``cost``.

What it cannot prove: that the usage recorded is what was really spent — the tools report it
(``ctx.report_usage``), the log only carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from affidavit.core.budget import Budget, Spent, exceeded_by_call
from affidavit.core.errors import AffidavitError
from affidavit.verify._violation import _Violation

INVARIANT = "budget"


class BudgetFold:
    """The budget state of one agent log as it is folded."""

    def __init__(self, recorded: object) -> None:
        self.budget = _read(recorded)
        self.spent = Spent()

    def called(self, p: Mapping[str, Any]) -> None:
        """A ``step_called``."""
        if p.get("kind") not in ("tool", "pure"):
            return
        reason = exceeded_by_call(self.budget, self.spent)
        if reason is not None:
            raise _Violation(
                INVARIANT,
                f"call {p.get('seq')!r} ({p.get('tool_name')!r}) ran past the job's budget: "
                f"{reason}",
            )
        self.spent.tool_calls += 1

    def finished(self, p: Mapping[str, Any]) -> None:
        """A ``node_finished``."""
        self.spent.add_usage(p.get("usage"))

    def resumed(self, p: Mapping[str, Any]) -> None:
        """A ``job_resumed``: a new budget, if it records one."""
        if p.get("budget") is not None:
            self.budget = _read(p["budget"])


def _read(recorded: object) -> Budget:
    try:
        return Budget.from_dict(recorded)
    except AffidavitError as exc:
        raise _Violation(INVARIANT, f"the recorded budget is not one: {exc.message}") from None
