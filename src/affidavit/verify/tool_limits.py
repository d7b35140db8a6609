"""``affidavit verify --limit NAME --since T``: whether a tool or model limit held across jobs,
from the grants the jobs' logs record (docs/limits.md, "Provable from the record").

Read-only. Every limited call records its grant in its job's log (``limit_grant``: the limit
as it stood, the grant's time, the claim that took it; docs/formats.md "Limits and budgets").
The check reads those grants from every job updated since ``T`` minus the limit's rate period
(a job's last update comes after every event of its log), and for each grant from ``T`` on:

- rate: the grants of the limit in the window of the grant's recorded period ending at it
  number at most the recorded count; the worst window is reported;
- concurrency: the calls of the limit in flight at the grant — granted, not yet ended — number
  at most the recorded concurrency; the peak is reported. A tool call ends at the
  ``tool_invocation_finished`` its own claim wrote; one a later claim closed (its worker died)
  is counted until that close, which was written after the claim's lease ended — later than
  the call really held its grant, so the count can only be too high, never too low; a call no
  event closed yet is counted until now. A pure step (a model request) ends at its
  ``node_finished``, written before its grant was given back.

What it cannot prove: the grants of jobs no longer in the database (retention archived them:
their packs hold their logs); times are the workers' clocks (docs/limits.md).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import orjson

from affidavit.core.errors import ConfigError
from affidavit.core.times import iso_us, parse_iso_us
from affidavit.store.base import Store
from affidavit.store.limit_calls import limited_call_events
from affidavit.verify._limits import read_grant
from affidavit.verify._violation import _Violation
from affidavit.verify.queue_limits import MAX_LISTED, LimitCheck

MAX_NAME = 200
_CLOSED_BY_OWN = ("success", "failure", "timeout")


@dataclass(slots=True)
class _Call:
    job_id: str
    granted_us: int
    rate: tuple[int, int] | None
    concurrency: int | None
    end_us: int | None = None
    bounded: bool = False  # ended by a later claim's close: an upper bound


@dataclass(frozen=True, slots=True)
class LimitProof:
    """The verdict on limit ``name`` from ``since`` to ``until`` (µs since the epoch)."""

    name: str
    since_us: int
    until_us: int
    calls: int
    jobs: int
    rate: LimitCheck | None
    concurrency: LimitCheck | None
    bounded_ends: int
    open_calls: int
    malformed: list[str]

    @property
    def ok(self) -> bool:
        checks = (self.rate, self.concurrency)
        return not self.malformed and all(c.ok for c in checks if c is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.name,
            "since": iso_us(self.since_us),
            "until": iso_us(self.until_us),
            "calls": self.calls,
            "jobs": self.jobs,
            "rate": self.rate.to_dict() if self.rate else None,
            "concurrency": self.concurrency.to_dict() if self.concurrency else None,
            "bounded_ends": self.bounded_ends,
            "open_calls": self.open_calls,
            "malformed": self.malformed[:MAX_LISTED],
            "ok": self.ok,
        }


def check_limit_name(name: str) -> None:
    """Raises ConfigError for a name no limit can have."""
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise ConfigError(
            f"not a limit name: {name[:40]!r}",
            hint="Give the name `affidavit limits list` shows (1 to 200 printable characters).",
        )


def verify_limit(store: Store, name: str, since_us: int, now_us: int) -> LimitProof:
    """Check limit ``name`` over the grants of every job's log from ``since_us`` to ``now_us``.

    Raises:
        ConfigError: a bad name, a limit no call has taken a grant of, or ``since`` after now.
    """
    check_limit_name(name)
    if since_us > now_us:
        raise ConfigError("--since is in the future", hint="Give a time before now.")
    with store.transaction(durable=False) as tx:
        declared = {u.name: u for u in tx.limit_usage(now_us=now_us)}
    usage = declared.get(name)
    if usage is None:
        raise ConfigError(
            f"no limit {name!r} has been used in this database",
            hint="List the limits with `affidavit limits list`.",
        )
    lookback_us = int((usage.period_seconds or 0) * 1e6)
    calls, malformed = _read(store, name, iso_us(max(since_us - lookback_us, 0)))
    still_open = sum(1 for c in calls if c.end_us is None)
    for call in calls:
        if call.end_us is None:
            call.end_us = now_us
    calls.sort(key=lambda c: c.granted_us)
    checked = [i for i, c in enumerate(calls) if c.granted_us >= since_us]
    return LimitProof(
        name,
        since_us,
        now_us,
        len(checked),
        len({calls[i].job_id for i in checked}),
        _rate(calls, checked),
        _concurrency(calls, checked),
        sum(1 for i in checked if calls[i].bounded),
        still_open,
        malformed,
    )


def _read(store: Store, name: str, updated_since: str) -> tuple[list[_Call], list[str]]:
    """The limit's calls in the logs (each tool call with its end where one was written), and
    the jobs whose records of them are malformed."""
    calls: list[_Call] = []
    open_tools: dict[tuple[str, str], _Call] = {}
    malformed: list[str] = []
    for job_id, kind, data in limited_call_events(store, updated_since):
        try:
            p = orjson.loads(data)
            if kind == "tool_invocation_finished":
                call = open_tools.pop((job_id, str(p.get("invocation_id"))), None)
                if call is not None:
                    call.end_us = parse_iso_us(str(p.get("at")))
                    own = not p.get("catch_up") and p.get("outcome") in _CLOSED_BY_OWN
                    call.bounded = not own
                continue
            g = p.get("limit_grant")
            if not isinstance(g, dict) or g.get("limit") != name:
                continue
            _, granted, _, rate, concurrency = read_grant(g)
            call = _Call(job_id, granted, None if rate is None else (rate[0], rate[1]), concurrency)
            if kind == "node_finished":
                call.end_us = max(parse_iso_us(str(p.get("at"))), granted)
            else:
                open_tools[(job_id, str(p.get("invocation_id")))] = call
            calls.append(call)
        except (_Violation, ValueError, TypeError, orjson.JSONDecodeError):
            if job_id not in malformed:
                malformed.append(job_id)
    return calls, malformed


def _rate(calls: list[_Call], checked: list[int]) -> LimitCheck | None:
    """The grant whose window of its recorded rate held the most starts over its count."""
    times = [c.granted_us for c in calls]
    worst: tuple[int, int, int] | None = None  # (excess, grant index, starts in its window)
    for i in checked:
        rate = calls[i].rate
        if rate is None:
            continue
        count, period = rate
        inside = bisect_right(times, times[i]) - bisect_right(times, times[i] - period)
        if worst is None or inside - count > worst[0]:
            worst = (inside - count, i, inside)
    if worst is None:
        return None
    _, i, inside = worst
    count, period = calls[i].rate or (0, 0)
    t = times[i]
    members = [c.job_id for c in calls if t - period < c.granted_us <= t]
    return LimitCheck(count, inside, t / 1e6, members)


def _concurrency(calls: list[_Call], checked: list[int]) -> LimitCheck | None:
    """The grant at which the most calls were in flight over its recorded concurrency (a
    call holds ``[granted, end)``: one that ended at an instant holds no slot at it)."""
    limited = [i for i in checked if calls[i].concurrency is not None]
    if not limited:
        return None
    starts = [c.granted_us for c in calls]  # (sorted: the calls are in grant order)
    ends = sorted(max(c.end_us or 0, c.granted_us) for c in calls)
    worst: tuple[int, int, int] | None = None  # (excess, grant index, calls in flight)
    for i in limited:
        t = starts[i]
        live = bisect_right(starts, t) - bisect_right(ends, t)
        excess = live - (calls[i].concurrency or 0)
        if worst is None or excess > worst[0]:
            worst = (excess, i, live)
    assert worst is not None
    _, i, live = worst
    t = starts[i]
    members = [c.job_id for c in calls if c.granted_us <= t < max(c.end_us or 0, c.granted_us)]
    return LimitCheck(calls[i].concurrency or 0, live, t / 1e6, members)
