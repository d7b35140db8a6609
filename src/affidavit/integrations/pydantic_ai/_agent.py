"""``AffidavitAgent``: the wrapper shape of earlier releases, kept as a thin deprecated alias
of :class:`~._durability.AffidavitDurability` (the capability does the work; the wrapper
registers it for an agent built without it and runs that agent with it)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

from pydantic_ai.agent import AbstractAgent, EventStreamHandler, WrapperAgent
from pydantic_ai.models import Model
from pydantic_ai.output import OutputDataT
from pydantic_ai.tools import AgentDepsT

import affidavit
from affidavit import Tool
from affidavit.integrations.pydantic_ai._durability import AffidavitDurability


class AffidavitAgent(WrapperAgent[AgentDepsT, OutputDataT]):
    """Deprecated: give the agent ``capabilities=[AffidavitDurability(...)]`` instead.

    ``AffidavitAgent(agent, name="support", ...)`` registers the same agent job as
    ``AffidavitDurability(name="support", ...)`` would (the arguments are the capability's),
    and runs ``agent`` with the capability inside it. Outside a job it is the wrapped agent.

    Raises:
        affidavit.ConfigError: as :class:`AffidavitDurability`.
        pydantic_ai.exceptions.UserError: no name; the wrapped agent has no model.
    """

    def __init__(
        self,
        wrapped: AbstractAgent[AgentDepsT, OutputDataT],
        *,
        name: str | None = None,
        tools: Sequence[Tool] = (),
        version: str | None = None,
        in_flight: str = "park",
        model_retries: int = 3,
        deps: Any = None,
        model_limit: affidavit.Limit | None = None,
        budget: affidavit.Budget | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        stream: affidavit.StreamLimit | None = None,
    ) -> None:
        warnings.warn(
            "AffidavitAgent is deprecated: use Agent(..., capabilities=[AffidavitDurability()])",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(wrapped)
        from pydantic_ai.exceptions import UserError

        agent_name = name or wrapped.name
        if not agent_name:
            raise UserError(
                "AffidavitAgent needs a name: AffidavitAgent(agent, name='support') "
                "(it names the agent job and its recorded steps)"
            )
        if not isinstance(wrapped.model, Model):
            raise UserError(
                f"AffidavitAgent {agent_name!r}: the wrapped agent needs a model "
                "(Agent(model, ...)); a model chosen per run cannot be recorded"
            )
        self.durability: AffidavitDurability[AgentDepsT] = AffidavitDurability(
            tools=tools,
            name=agent_name,
            version=version,
            in_flight=in_flight,
            model_retries=model_retries,
            model_limit=model_limit,
            budget=budget,
            deps=deps,
            event_stream_handler=event_stream_handler or wrapped.event_stream_handler,
            stream=stream,
        )
        # the code recorded with the job is the module constructing the wrapper
        self.durability._code_module = sys._getframe(1).f_globals.get("__name__")
        self.durability._per_run = True
        self.durability.register(wrapped, agent_name)
        self._name = agent_name

    @property
    def name(self) -> str | None:
        return self._name

    @name.setter
    def name(self, value: str | None) -> None:  # pragma: no cover - WrapperAgent's contract
        from pydantic_ai.exceptions import UserError

        raise UserError("the name of an AffidavitAgent is fixed: it names its recorded jobs")

    @property
    def job(self) -> Any:
        """The registered agent job."""
        return self.durability.job

    @property
    def registrations(self) -> list[Any]:
        """As :attr:`AffidavitDurability.registrations`."""
        return self.durability.registrations
