"""Live streams out of a running job (``ctx.emit``): the bounds of a stream value and of a
job's stream, as both the runtime and the verifier read them from the record.

A value is any JSON value whose canonical encoding is at most :data:`MAX_VALUE_BYTES`. A job's
stream is bounded by a :class:`StreamLimit` — at most ``max_values`` values of at most
``max_bytes`` canonical bytes in all — recorded in ``agent_started`` (``stream``) when the agent
declares one; a log without it has :data:`DEFAULT_LIMIT`. Each value is one ``stream_emitted``
event (docs/formats.md, "Streams"): ``seq`` numbers a job's values 0, 1, 2, … in log order;
``node_id``, ``step_id`` and ``attempt`` name the step that emitted it, absent for a value the
agent function emitted itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.errors import CanonicalizationError, ConfigError, StreamError

#: The largest value ``ctx.emit`` takes: its canonical JSON, in bytes.
MAX_VALUE_BYTES = 64 * 1024
_MAX_VALUES_CEILING = 1_000_000
_MAX_BYTES_CEILING = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamLimit:
    """At most ``max_values`` stream values, ``max_bytes`` canonical bytes in all, per job."""

    max_values: int = 10_000
    max_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name, ceiling in (
            ("max_values", _MAX_VALUES_CEILING),
            ("max_bytes", _MAX_BYTES_CEILING),
        ):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= ceiling:
                raise ConfigError(f"StreamLimit {name} must be an integer in 1..{ceiling}")

    def to_dict(self) -> dict[str, int]:
        """The limit as ``agent_started`` records it."""
        return {"max_values": self.max_values, "max_bytes": self.max_bytes}

    @classmethod
    def from_dict(cls, data: object) -> StreamLimit:
        """Read a recorded limit.

        Raises:
            ConfigError: not an object of exactly those fields, or a value out of range.
        """
        if not isinstance(data, Mapping) or set(data) != {"max_values", "max_bytes"}:
            raise ConfigError(f"a stream limit is {{max_values, max_bytes}}, not {data!r:.80}")
        return cls(data["max_values"], data["max_bytes"])


DEFAULT_LIMIT = StreamLimit()


def encode_value(value: Any) -> bytes:
    """The canonical bytes of a stream value.

    Raises:
        StreamError: the value is not JSON, or its encoding is over :data:`MAX_VALUE_BYTES`.
    """
    try:
        encoded = canonical(value)
    except CanonicalizationError as exc:
        raise StreamError(f"ctx.emit: the value is not JSON: {exc.message}") from None
    except RecursionError:
        raise StreamError("ctx.emit: the value is nested too deeply") from None
    if len(encoded) > MAX_VALUE_BYTES:
        raise StreamError(
            f"ctx.emit: the value is {len(encoded)} bytes as canonical JSON, over the "
            f"{MAX_VALUE_BYTES} a stream value may have"
        )
    return encoded


def over_limit(limit: StreamLimit, values: int, total: int, size: int) -> str | None:
    """Why one more value of ``size`` bytes is over ``limit`` after ``values`` values of
    ``total`` bytes (``None``: it is within)."""
    if values + 1 > limit.max_values:
        return f"the job's stream has its {limit.max_values} values already"
    if total + size > limit.max_bytes:
        return (
            f"the job's stream would hold {total + size} bytes, over its "
            f"{limit.max_bytes} (StreamLimit max_bytes)"
        )
    return None
