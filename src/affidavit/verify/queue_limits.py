"""``affidavit verify --queue Q --since T``: whether a queue's limits held, from its recorded
grants (docs/queues.md, "Proving the limits held").

Read-only. The rate: no window of the rate's period (half-open, ``(end - period, end]``) holds
more starts than the rate allows; the worst window is reported. Concurrency: no instant has
more holds on the queue's slots than ``concurrency``, nor more of one worker's than
``worker_concurrency``; a hold runs from its claim to its recorded end (``[held_from, end)``,
both by the database's clock: the claim's time read after its lock), or to now while its
lease is live. The peak is reported with its time and jobs. A hold whose end
was never recorded (a grant made before the database recorded ends) makes the concurrency
unprovable, and the verdict fails: nothing is guessed.

The limits checked are the queue's configuration as the database holds it now.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from affidavit.core.errors import ConfigError
from affidavit.core.rates import peak_overlap, window_start, window_starts, worst_window
from affidavit.store.base import Store
from affidavit.store.queue_grants import UNKNOWN, Grant, queue_grants
from affidavit.store.queues import QueueConfig, check_queue_name, get_queue

MAX_SINCE_TEXT = 64
MAX_LISTED = 100  # job ids listed for a window or a peak (the count is always exact)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_since(text: str) -> float:
    """``text`` (ISO 8601 with a zone, e.g. ``2026-12-01T00:00:00Z``) in Unix seconds.

    Raises:
        ConfigError: not such a time.
    """
    hint = "Give --since as ISO 8601 with a zone, e.g. 2026-12-01T00:00:00Z."
    if len(text) > MAX_SINCE_TEXT:
        raise ConfigError(f"--since is at most {MAX_SINCE_TEXT} characters", hint=hint)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"not an ISO 8601 time: {text!r}", hint=hint) from None
    if at.tzinfo is None:
        raise ConfigError(f"--since has no time zone: {text!r}", hint=hint)
    return at.timestamp()


@dataclass(frozen=True, slots=True)
class LimitCheck:
    """One limit against the record: the limit, the worst the record shows, when, and which
    jobs (and worker, for ``worker_concurrency``)."""

    limit: int
    worst: int
    at: float | None
    job_ids: list[str]
    worker: str | None = None
    unknown: int = 0  # holds without a recorded end (concurrency only)

    @property
    def ok(self) -> bool:
        return self.worst <= self.limit and not self.unknown

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "limit": self.limit,
            "worst": self.worst,
            "at": iso(self.at),
            "job_ids": self.job_ids[:MAX_LISTED],
        }
        if self.worker is not None:
            doc["worker"] = self.worker
        if self.unknown:
            doc["unknown_ends"] = self.unknown
        return doc | {"ok": self.ok}


@dataclass(frozen=True, slots=True)
class QueueProof:
    """The verdict on queue ``config.name`` from ``since`` to ``until``."""

    config: QueueConfig
    since: float
    until: float
    grants: int
    starts: int
    rate: LimitCheck | None
    concurrency: LimitCheck | None
    worker_concurrency: LimitCheck | None
    unknown: list[Grant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        checks = (self.rate, self.concurrency, self.worker_concurrency)
        return all(c.ok for c in checks if c is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.config.name,
            "limits": self.config.to_dict(),
            "since": iso(self.since),
            "until": iso(self.until),
            "grants": self.grants,
            "starts": self.starts,
            "rate": self.rate.to_dict() if self.rate else None,
            "concurrency": self.concurrency.to_dict() if self.concurrency else None,
            "worker_concurrency": (
                self.worker_concurrency.to_dict() if self.worker_concurrency else None
            ),
            "unknown_ends": [
                {"job_id": g.job_id, "attempt_id": g.attempt_id, "claimed_at": iso(g.claimed_at)}
                for g in self.unknown[:MAX_LISTED]
            ],
            "ok": self.ok,
        }


def verify_queue(store: Store, name: str, since: float, now: float) -> QueueProof:
    """Check queue ``name``'s limits over its grants from ``since`` to ``now``.

    Raises:
        ConfigError: a bad name, a queue the database does not know, or ``since`` after now.
    """
    check_queue_name(name)
    config = get_queue(store, name)
    if config is None:
        raise ConfigError(
            f"no queue {name!r} in the database (its limits are unknown)",
            hint="List the queues with `affidavit queues list`.",
        )
    if since > now:
        raise ConfigError("--since is in the future", hint="Give a time before now.")
    lookback = config.rate.period_seconds if config.rate is not None else 0.0
    grants = queue_grants(store, name, since, lookback, now)
    in_span = [g for g in grants if g.claimed_at >= since]
    unknown = [g for g in in_span if g.end is None]
    known = [g for g in grants if g.end is not None]
    return QueueProof(
        config,
        since,
        now,
        len(in_span),
        sum(1 for g in in_span if g.started),
        _rate(config, grants, since),
        _concurrency(config.concurrency, known, since, len(unknown)),
        _per_worker(config.worker_concurrency, known, since, len(unknown)),
        unknown,
    )


def _rate(config: QueueConfig, grants: list[Grant], since: float) -> LimitCheck | None:
    """The worst window of the rate's period that ends from ``since`` on (the worst window
    ends at a start), counting the starts before ``since`` that it holds."""
    rate = config.rate
    if rate is None:
        return None
    starts = sorted((g for g in grants if g.started), key=lambda g: g.claimed_at)
    times = [g.claimed_at for g in starts]
    first_late = bisect_left(times, since)
    if first_late == 0:  # nothing before the span: the worst window of all the starts
        worst, end = worst_window(rate, times)
    else:
        worst, end = 0, None
        for last in range(first_late, len(times)):
            held = last - bisect_right(times, window_start(rate, times[last])) + 1
            if held > worst:
                worst, end = held, times[last]
    ids = [starts[i].job_id for i in window_starts(rate, times, end)] if end is not None else []
    return LimitCheck(rate.count, worst, end, ids)


def _concurrency(
    limit: int | None, grants: list[Grant], since: float, unknown: int
) -> LimitCheck | None:
    if limit is None:
        return None
    # a hold from its start by the clock of its end (held_from), so the slot a claim took from
    # an ending job never reads as held twice at the hand-off
    peak, at, members = peak_overlap([(max(g.held_from, since), _end(g)) for g in grants])
    return LimitCheck(limit, peak, at, [grants[i].job_id for i in members], unknown=unknown)


def _per_worker(
    limit: int | None, grants: list[Grant], since: float, unknown: int
) -> LimitCheck | None:
    if limit is None:
        return None
    by_owner: dict[str, list[Grant]] = defaultdict(list)
    for g in grants:
        by_owner[g.owner].append(g)
    worst = LimitCheck(limit, 0, None, [], unknown=unknown)
    for owner, mine in sorted(by_owner.items()):
        check = _concurrency(limit, mine, since, unknown)
        assert check is not None
        if check.worst > worst.worst:
            worst = LimitCheck(limit, check.worst, check.at, check.job_ids, owner, unknown)
    return worst


def _end(g: Grant) -> float:
    assert g.end is not None and g.ended_as != UNKNOWN
    return g.end
