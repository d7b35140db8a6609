"""A job's live stream (``stream_emitted`` events), checked offline (invariant ``stream``).

What a log verified ✓ proves about its stream (docs/formats.md, "Streams"): its values are
numbered 0, 1, 2, … in log order without gaps or repeats; each is JSON of at most 64 KiB as
canonical JSON; the stream stays within the job's limit (``stream`` of ``agent_started``, or
the default limit); a value that names a step names a step of the job with its step id and an
attempt ≥ 1, emitted while that step had not completed (a completed step never runs again).

What it cannot prove: that a value is what the code computed — the runtime records what
``ctx.emit`` was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError
from affidavit.core.streams import DEFAULT_LIMIT, MAX_VALUE_BYTES, StreamLimit
from affidavit.verify._violation import _Violation

INVARIANT = "stream"
_BARE = frozenset({"at", "seq", "value"})
_OF_STEP = _BARE | {"node_id", "step_id", "attempt"}


class StreamFold:
    """The stream state of one log as it is folded."""

    def __init__(self) -> None:
        self.limit = DEFAULT_LIMIT
        self.values = 0
        self.bytes = 0

    def limited(self, recorded: object) -> None:
        """The ``stream`` of ``agent_started``."""
        try:
            self.limit = StreamLimit.from_dict(recorded)
        except AffidavitError as exc:
            raise _Violation(
                INVARIANT, f"the recorded stream limit is not one: {exc.message}"
            ) from None

    def emitted(self, p: Mapping[str, Any]) -> str | None:
        """A ``stream_emitted``: the node id of the step it names, for the caller to check
        against the job's steps (``None``: the agent function's own value)."""
        keys = set(p)
        if keys not in (_BARE, _OF_STEP):
            raise _Violation(
                INVARIANT,
                f"fields {sorted(keys)} are neither {sorted(_BARE)} nor those with "
                "node_id, step_id and attempt",
            )
        seq = p["seq"]
        if type(seq) is not int or seq != self.values:
            raise _Violation(INVARIANT, f"value {seq!r}; the next value is {self.values}")
        try:
            size = len(canonical(p["value"]))
        except AffidavitError as exc:
            raise _Violation(INVARIANT, f"value {seq}: {exc.message}") from None
        if size > MAX_VALUE_BYTES:
            raise _Violation(INVARIANT, f"value {seq} is {size} bytes, over {MAX_VALUE_BYTES}")
        if self.values + 1 > self.limit.max_values or self.bytes + size > self.limit.max_bytes:
            raise _Violation(
                INVARIANT,
                f"value {seq} is past the job's stream limit ({self.limit.max_values} values, "
                f"{self.limit.max_bytes} bytes)",
            )
        self.values += 1
        self.bytes += size
        if keys == _BARE:
            return None
        attempt = p["attempt"]
        if type(attempt) is not int or attempt < 1:
            raise _Violation(INVARIANT, f"value {seq}: attempt {attempt!r} is not an integer ≥ 1")
        node_id = p["node_id"]
        return node_id if type(node_id) is str else ""
