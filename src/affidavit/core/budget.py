"""Budgets of agent jobs (``affidavit.Budget``): what a job may spend, and what it spent, as
both the runtime and the verifier read them from the record.

A job's budget is recorded in its ``agent_started`` (``budget``) and replaced, absolutely, by
the ``budget`` of a ``job_resumed`` that continues a ``budget_exceeded`` park. What it spent:
``tool_calls``, its calls (``step_called`` of kind ``tool`` or ``pure``); ``model_tokens`` and
``cost``, the sums of the ``usage`` its steps' ``node_finished`` events record
(``ctx.report_usage``). A call may start only while it keeps the job within its budget: the
call count with it at most ``tool_calls``, and the tokens and cost spent before it below
theirs (a call's own usage is known only once it ran).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from affidavit.core.errors import ConfigError

_FIELDS = ("tool_calls", "model_tokens", "cost")
_MAX = 10**15


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``tool_calls`` calls, ``model_tokens`` tokens and ``cost`` (in the unit the
    tools report) for one agent job; ``None``: no bound on that."""

    tool_calls: int | None = None
    model_tokens: int | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        for name in ("tool_calls", "model_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 <= value <= _MAX):
                raise ConfigError(f"Budget {name} must be an integer ≥ 0, not {value!r}")
        c = self.cost
        if c is not None and (
            type(c) not in (int, float) or not math.isfinite(c) or not 0 <= c <= _MAX
        ):
            raise ConfigError(f"Budget cost must be a finite number ≥ 0, not {c!r}")
        if self.tool_calls is None and self.model_tokens is None and self.cost is None:
            raise ConfigError(
                "a Budget needs tool_calls, model_tokens or cost",
                hint="For example Budget(tool_calls=50, model_tokens=200_000, cost=5.0).",
            )

    def to_dict(self) -> dict[str, Any]:
        """The budget as the record holds it (unset bounds left out)."""
        return {n: getattr(self, n) for n in _FIELDS if getattr(self, n) is not None}

    @classmethod
    def from_dict(cls, data: object) -> Budget:
        """Read a budget from a record or from user input (``--budget JSON``).

        Raises:
            ConfigError: not an object of those fields, or a value out of range.
        """
        if not isinstance(data, Mapping) or not set(data) <= set(_FIELDS):
            raise ConfigError(
                f"a budget is an object of {', '.join(_FIELDS)}, not {str(data)[:80]!r}",
                hint='For example {"tool_calls": 80, "cost": 10}.',
            )
        return cls(**{str(k): v for k, v in data.items()})


@dataclass(slots=True)
class Spent:
    """What a job spent so far."""

    tool_calls: int = 0
    model_tokens: int = 0
    cost: float = 0.0

    def add_usage(self, usage: object) -> None:
        """Add a ``node_finished``'s ``usage`` (ignored unless well formed)."""
        if not isinstance(usage, Mapping):
            return
        tokens, cost = usage.get("tokens"), usage.get("cost")
        if type(tokens) is int and tokens > 0:
            self.model_tokens += tokens
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0:
            self.cost += float(cost) if math.isfinite(cost) else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"tool_calls": self.tool_calls, "model_tokens": self.model_tokens, "cost": self.cost}


def exceeded_by_call(budget: Budget, spent: Spent) -> str | None:
    """Why one more call would break ``budget`` after ``spent`` (``None``: it may start)."""
    if budget.tool_calls is not None and spent.tool_calls + 1 > budget.tool_calls:
        return f"{spent.tool_calls} of {budget.tool_calls} tool calls made"
    if budget.model_tokens is not None and spent.model_tokens >= budget.model_tokens:
        return f"{spent.model_tokens} of {budget.model_tokens} model tokens used"
    if budget.cost is not None and spent.cost >= budget.cost:
        return f"cost {spent.cost:g} of {budget.cost:g} spent"
    return None
