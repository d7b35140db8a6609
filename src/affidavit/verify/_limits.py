"""The tool and model limits of one log, checked offline (invariant ``limit``).

What a log verified ✓ proves about its limited calls (``limit_grant`` on a
``tool_invocation_started``, or on the ``node_finished`` of a limited pure step — a model
request with a model limit among them; FORMATS.md):

- each grant is well formed: a limit name, a time (RFC 3339, µs), the claim that took it, and
  the limit as it stood (``rate``: count and period in µs; ``concurrency``);
- the grants of one limit never go backwards in time (the store hands them out in order), as
  far as the log's order shows them: a tool call's grant is recorded before its call, a pure
  step's with its end, so a pure step's grant is ordered by its time only;
- for every grant, the job's grants of that limit in the window of its recorded rate ending at
  it number at most the rate's count;
- at every grant, the job's calls of that limit in flight — granted, not yet finished —
  number at most its recorded concurrency. A call is over at its ``tool_invocation_finished``
  when its own claim wrote it; a call its claim never closed (the worker died, a later claim
  closed it as lost or unknown) held its grant until the claim's lease ended, which came before
  the next claim's first grant: it is counted until then. A pure step's call is over at its
  ``node_finished``, written after the call and before the grant was given back.

What it cannot prove: calls of other jobs (``affidavit verify --queue`` / across jobs reads
every job's grants); and times are the workers' clocks, so workers whose clocks disagree by
more than the gap between one call's end and the next one's grant can make a log that held its
limit read as one that did not (never the reverse within one claim).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from affidavit.core.times import parse_iso_us
from affidavit.verify._violation import _Violation

INVARIANT = "limit"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FORGOTTEN = 2**62  # the end of a call whose claim never closed it and no later claim followed


@dataclass(slots=True)
class _Call:
    limit: str
    granted_us: int
    attempt_id: str
    rate: tuple[int, int] | None
    concurrency: int | None
    version: int
    end_us: int | None = None  # its own claim's finish; None while unknown


class LimitFold:
    """The limited calls of one log as it is folded."""

    def __init__(self) -> None:
        self.calls: dict[str, _Call] = {}  # invocation id -> the call
        self.open: set[str] = set()  # limited invocations not finished yet
        self._last: dict[str, int] = {}

    def started(self, p: Mapping[str, Any], version: int) -> None:
        """A ``tool_invocation_started`` with a ``limit_grant``."""
        name, granted, attempt, rate, concurrency = read_grant(p.get("limit_grant"))
        if granted < self._last.get(name, 0):
            at = p["limit_grant"]["granted_at"]
            raise _Violation(INVARIANT, f"grant of limit {name!r} at {at} before an earlier one")
        self._last[name] = granted
        invocation = str(p.get("invocation_id"))
        self.calls[invocation] = _call(name, granted, attempt, rate, concurrency, version)
        self.open.add(invocation)

    def step_finished(self, p: Mapping[str, Any], version: int) -> None:
        """The ``node_finished`` of a limited pure step: its call ran from its grant to this
        event (its grant is recorded here, after the call)."""
        name, granted, attempt, rate, concurrency = read_grant(p.get("limit_grant"))
        try:
            end = parse_iso_us(str(p.get("at")))
        except ValueError:
            raise _Violation(INVARIANT, "a limited step's finish has no time") from None
        if end < granted:
            raise _Violation(INVARIANT, f"limit {name!r}: a step finished before its grant")
        grant_id = p["limit_grant"].get("grant_id")
        key = f"step:{grant_id if isinstance(grant_id, str) else version}"
        if key in self.calls:
            raise _Violation(INVARIANT, f"limit {name!r}: grant {str(grant_id)[:40]!r} used twice")
        call = _call(name, granted, attempt, rate, concurrency, version)
        call.end_us = end
        self.calls[key] = call

    def finished(self, p: Mapping[str, Any]) -> None:
        """The ``tool_invocation_finished`` of a limited call."""
        invocation = str(p.get("invocation_id"))
        self.open.discard(invocation)
        call = self.calls.get(invocation)
        if (
            call is None
            or p.get("catch_up")
            or p.get("outcome")
            not in (
                "success",
                "failure",
                "timeout",
            )
        ):
            return  # closed by another claim: over when its own claim's lease ended
        try:
            call.end_us = parse_iso_us(str(p.get("at")))
        except ValueError:
            raise _Violation(INVARIANT, "a limited call's finish has no time") from None

    def check(self) -> tuple[int, str] | None:
        """The first grant (its event version, and why) that broke its recorded limit."""
        by_limit: dict[str, list[_Call]] = {}
        for call in self.calls.values():
            by_limit.setdefault(call.limit, []).append(call)
        for name, calls in by_limit.items():
            calls.sort(key=lambda c: c.granted_us)
            ends = [_end(c, calls) for c in calls]
            for i, call in enumerate(calls):
                t = call.granted_us
                if call.rate is not None:
                    count, period = call.rate
                    inside = sum(1 for c in calls[: i + 1] if c.granted_us > t - period)
                    if inside > count:
                        return call.version, (
                            f"limit {name!r}: {inside} calls started in {period / 1e6:g}s, "
                            f"more than its rate {count}"
                        )
                if call.concurrency is not None:
                    live = sum(1 for c, e in zip(calls[: i + 1], ends, strict=False) if e > t)
                    if live > call.concurrency:
                        return call.version, (
                            f"limit {name!r}: {live} calls in flight at {t}µs, more than its "
                            f"concurrency {call.concurrency}"
                        )
        return None


def read_grant(g: Any) -> tuple[str, int, str, Any, int | None]:
    """A recorded grant's limit, time (µs), claim, rate and concurrency, checked."""
    if not isinstance(g, Mapping):
        raise _Violation(INVARIANT, "limit_grant is not an object")
    name, at, attempt = g.get("limit"), g.get("granted_at"), g.get("attempt_id")
    rate, concurrency = g.get("rate"), g.get("concurrency")
    if not (isinstance(name, str) and isinstance(attempt, str) and isinstance(at, str)):
        raise _Violation(INVARIANT, "limit_grant lacks its limit, time or claim")
    try:
        granted = parse_iso_us(at)
    except ValueError:
        raise _Violation(INVARIANT, f"limit_grant time {at[:40]!r} is not a time") from None
    if rate is not None and not (
        isinstance(rate, list) and len(rate) == 2 and all(type(v) is int and v > 0 for v in rate)
    ):
        raise _Violation(INVARIANT, f"limit_grant rate {rate!r} is not [count, period µs]")
    if concurrency is not None and not (type(concurrency) is int and concurrency > 0):
        raise _Violation(INVARIANT, f"limit_grant concurrency {concurrency!r}")
    return name, granted, attempt, rate, concurrency


def _call(
    name: str, granted: int, attempt: str, rate: Any, concurrency: int | None, version: int
) -> _Call:
    return _Call(
        name, granted, attempt, None if rate is None else (rate[0], rate[1]), concurrency, version
    )


def _end(call: _Call, calls: list[_Call]) -> int:
    if call.end_us is not None:
        return call.end_us
    later = [
        c.granted_us
        for c in calls
        if c.attempt_id != call.attempt_id and c.granted_us > call.granted_us
    ]
    return min(later) if later else _FORGOTTEN
