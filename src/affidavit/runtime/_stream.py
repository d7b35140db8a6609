"""A job's live stream (``ctx.emit``): each value one ``stream_emitted`` event, written at once
in a transaction of its own, so that a reader following the log sees it while the job runs.

Two kinds of emitter, and how each replays (docs/runtime.md, "Streams"):

- **the agent function** (``AgentContext.emit``): its values are numbered in program order
  within the run. A recovered run calls the function from the top, so it emits again what the
  record holds: the first ``agent_emits`` values of the run (as many as the log has) are not
  written again. Once the job's stream refused a value for its limit, every later value of the
  run is refused too, so a value the record lacks is never followed by one it has.
- **a step** (``ToolContext.emit`` in a tool or a pure step, a model request among them): its
  values name the step and its attempt. A completed step is never run again, so it never emits
  again; a step that runs again (a retry, or a pure step a crash cut off) emits as it runs.
  A step's stream closes when its function returns: a value from a thread it left running is
  refused.

A refused value (not JSON, over 64 KiB, over the job's limit) raises
:class:`~affidavit.core.errors.StreamError` and records nothing. Stream writes are not synced
on their own (the next durable commit covers them, as a tool step's T2): a value lost to a power
failure is one the recovered run emits again at the same place.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import orjson

from affidavit.core import crash
from affidavit.core.errors import ConfigError, StreamError
from affidavit.core.streams import DEFAULT_LIMIT, StreamLimit, encode_value, over_limit

if TYPE_CHECKING:
    from affidavit.record import ReplayContext
    from affidavit.runtime._journal import Journal
    from affidavit.runtime._run_base import Item


class StreamWriter:
    """The stream of one run of one job: the next ``seq``, what the job's stream holds, and
    how many of the agent function's values the log has already."""

    def __init__(self, journal: Journal, replay: ReplayContext) -> None:
        self._journal = journal
        self._values = replay.stream_values
        self._bytes = replay.stream_bytes
        self._recorded_agent = replay.agent_emits
        self._agent_calls = 0  # the agent function's emits in this run
        self._full: str | None = None  # why the stream refused a value for its limit
        self.limit = DEFAULT_LIMIT
        recorded = (replay.agent or {}).get("stream")
        if recorded is not None:
            try:
                self.limit = StreamLimit.from_dict(recorded)
            except ConfigError:  # (a record edited outside affidavit: verify says so)
                self._full = "the job's recorded stream limit cannot be read"
        self._lock = threading.Lock()

    def emit(
        self, value: Any, step: tuple[str, str, int] | None = None, prelude: tuple[Item, ...] = ()
    ) -> bool:
        """Append ``value`` to the job's stream, from the agent function (``step`` ``None``) or
        from the step ``(node_id, step_id, attempt)``, after ``prelude`` in the same
        transaction. Returns whether it was written: a value of the agent function the log
        holds already is not.

        Raises:
            StreamError: the value is refused; nothing is written.
            StoreError, Stop: the write failed (a lost lease: ``FencedError``).
        """
        encoded = encode_value(value)
        with self._lock:
            if step is None:
                index = self._agent_calls
                self._agent_calls += 1
                if index < self._recorded_agent:
                    return False
            if self._full is None:
                self._full = over_limit(self.limit, self._values, self._bytes, len(encoded))
            if self._full is not None:
                raise StreamError(f"ctx.emit: {self._full}")
            payload: dict[str, Any] = {"seq": self._values, "value": orjson.Fragment(encoded)}
            if step is not None:
                payload["node_id"], payload["step_id"], payload["attempt"] = step
            self._journal.write(*prelude, ("stream_emitted", payload), fast=True)
            self._values += 1
            self._bytes += len(encoded)
            crash.crash_point("stream.after_emit")
        return True

    def for_step(
        self, node_id: str, step_id: str, attempt: int, prelude: tuple[Item, ...] = ()
    ) -> StepStream:
        """The stream of one call of a step's function; ``prelude``: the events the step
        writes with its record (an agent's ``step_called``), written before its first value."""
        return StepStream(self, (node_id, step_id, attempt), prelude)


class StepStream:
    """What ``ToolContext.emit`` writes through, open while the step's function runs.

    A pure step's events are written in one transaction after it returns, its agent
    ``step_called`` among them; a value it emits names the step, so its first one is written
    after that ``step_called`` (:attr:`prelude_written`: the step's record must not repeat it).
    """

    __slots__ = ("_lock", "_open", "_prelude", "_step", "_writer", "prelude_written")

    def __init__(
        self, writer: StreamWriter, step: tuple[str, str, int], prelude: tuple[Item, ...]
    ) -> None:
        self._writer = writer
        self._step = step
        self._prelude = prelude
        self.prelude_written = False
        self._open = True
        self._lock = threading.Lock()  # held by an emit in progress: close waits for it

    def emit(self, value: Any) -> None:
        """See :meth:`StreamWriter.emit`; refused once the step's function returned."""
        with self._lock:
            if not self._open:
                raise StreamError(
                    f"ctx.emit: step {self._step[0]!r} is over (its function returned)",
                    hint="Emit from the tool itself, before it returns.",
                )
            self._writer.emit(value, self._step, self._prelude)
            if self._prelude:
                self._prelude, self.prelude_written = (), True

    def close(self) -> None:
        """End the step's stream (before its result is recorded)."""
        with self._lock:
            self._open = False
