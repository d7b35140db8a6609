"""Tool and model limits across workers: ``@affidavit.tool("chat", limit=Limit(rate="50/10s",
concurrency=4))``.

A limited call takes a grant (:meth:`~affidavit.store.base.Transaction.limit_take`) before its
T1 and gives it back in its T2 (or as soon as its run stops acting); a worker that dies
holding a grant frees it with its lease. While it waits for a grant the call records nothing
and holds no ledger row: the run may stop there (the worker stopping, the lease lost) and the
call is taken up again wherever the job is claimed next. The grant is recorded in the call's
``tool_invocation_started`` (``limit_grant``), so that verification checks the limit offline.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from affidavit.core.errors import ConfigError
from affidavit.core.rates import Rate, parse_rate
from affidavit.core.times import iso_us
from affidavit.store import Store, Transaction
from affidavit.store.limit_waits import IN_USE_US, Declared, declare_limit, wait_begin, wait_end

if TYPE_CHECKING:
    from affidavit.runtime._journal import Journal, RunControl
    from affidavit.runtime._sdk import ToolRegistry

_NAME_MAX = 200
# The longest single wait between two takes of a grant only a release can free.
_POLL_MAX = 0.05


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``rate`` (``"N/PERIOD"``: ``"50/10s"``) calls started in any sliding window of
    the period, and at most ``concurrency`` in flight, across every worker and process of the
    store. ``name``: the limit's name, to share one limit among several tools (by default the
    tool's name; a model limit's is ``model:<model name>``)."""

    rate: str | None = None
    concurrency: int | None = None
    name: str | None = None
    parsed_rate: Rate | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.rate is None and self.concurrency is None:
            raise ConfigError(
                "a Limit needs a rate, a concurrency or both",
                hint='For example Limit(rate="50/10s", concurrency=4).',
            )
        if self.rate is not None:
            try:
                object.__setattr__(self, "parsed_rate", parse_rate(self.rate))
            except ValueError as exc:
                raise ConfigError(f"Limit rate: {exc}") from None
        c = self.concurrency
        if c is not None and (type(c) is not int or c < 1):
            raise ConfigError(f"Limit concurrency must be an integer ≥ 1, not {c!r}")
        n = self.name
        if n is not None and (not isinstance(n, str) or not n or len(n) > _NAME_MAX):
            raise ConfigError(f"a Limit name must be text of 1 to {_NAME_MAX} characters")

    def name_for(self, tool_name: str) -> str:
        """The name the store keeps this limit's grants under."""
        return self.name or tool_name

    @property
    def rate_us(self) -> tuple[int, int] | None:
        """The rate as (count, period in µs), as the store counts it."""
        r = self.parsed_rate
        return None if r is None else (r.count, max(1, round(r.period_seconds * 1e6)))


@dataclass(slots=True)
class Grant:
    """A grant held by one call: recorded with its T1, released by its T2."""

    name: str
    grant_id: str
    granted_us: int
    attempt_id: str
    limit: Limit
    released: bool = False

    def record(self) -> dict[str, Any]:
        """The grant as ``tool_invocation_started`` records it (FORMATS.md)."""
        out: dict[str, Any] = {
            "limit": self.name,
            "grant_id": self.grant_id,
            "granted_at": iso_us(self.granted_us),
            "attempt_id": self.attempt_id,
        }
        if self.limit.rate_us is not None:
            out["rate"] = list(self.limit.rate_us)
        if self.limit.concurrency is not None:
            out["concurrency"] = self.limit.concurrency
        return out


def now_us() -> int:
    return time.time_ns() // 1000


class Limiter:
    """Takes and releases the grants of one run's limited calls.

    ``stop_check`` is called between takes: it raises to end the run while waiting (the worker
    stopping, the lease lost). A waiting call is shown (store/limit_waits.py: not the record)
    until it is granted; ``on_wait(name, reason)`` is told once a call starts waiting."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        attempt_id: str,
        *,
        stop_check: Callable[[], None],
        on_wait: Callable[[str, str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.stop_check = stop_check
        self.on_wait = on_wait
        self.sleep = sleep

    def take(self, name: str, limit: Limit) -> Grant:
        """Wait for a grant of ``limit`` (named ``name``) and return it.

        Raises:
            Stop: the run ends while waiting (from ``stop_check``), or ``"lost"``: the claim
                no longer holds the job.
        """
        from affidavit.runtime._run_base import Stop

        grant_id = uuid.uuid4().hex
        poll = 0.002
        waiting = False
        try:
            while True:
                with self.store.transaction(durable=False) as tx:
                    answer = tx.limit_take(
                        name,
                        grant_id=grant_id,
                        job_id=self.job_id,
                        attempt_id=self.attempt_id,
                        clock=now_us,
                        rate=limit.rate_us,
                        concurrency=limit.concurrency,
                    )
                    if waiting and answer.granted_us is not None:  # with the grant: no gap
                        wait_end(
                            tx, grant_id=grant_id, job_id=self.job_id, attempt_id=self.attempt_id
                        )
                if answer.granted_us is not None:
                    waiting = False
                    return Grant(name, grant_id, answer.granted_us, self.attempt_id, limit)
                if answer.reason == "fenced":
                    raise Stop("lost")
                if not waiting:
                    self._wait_begin(name, grant_id, answer.reason)
                    waiting = True
                self.stop_check()
                if answer.wait_seconds is not None:  # a rate: the window frees a slot then
                    self.sleep(min(answer.wait_seconds, _POLL_MAX))
                else:  # a release frees it: look again soon, then less often
                    self.sleep(poll)
                    poll = min(poll * 2, _POLL_MAX)
        finally:
            if waiting:  # the run stops waiting (Stop, an error): nothing to show any more
                self._wait_end(grant_id)

    def _wait_begin(self, name: str, grant_id: str, reason: str) -> None:
        """Show the wait (``limit_waits``: not the record), then tell ``on_wait``."""
        with self.store.transaction(durable=False) as tx:
            wait_begin(
                tx,
                grant_id=grant_id,
                name=name,
                job_id=self.job_id,
                attempt_id=self.attempt_id,
                since=iso_us(now_us()),
                reason=reason,
            )
        if self.on_wait is not None:
            self.on_wait(name, reason)

    def _wait_end(self, grant_id: str) -> None:
        # Best effort: a row left behind (the database unavailable now) is not shown once the
        # claim is over, and goes with the job's next grant.
        with contextlib.suppress(Exception), self.store.transaction(durable=False) as tx:
            wait_end(tx, grant_id=grant_id, job_id=self.job_id, attempt_id=self.attempt_id)

    def release(self, grant: Grant) -> None:
        """Release ``grant`` in a transaction of its own (a call that stopped before its T2)."""
        if grant.released:
            return
        with self.store.transaction(durable=False) as tx:
            tx.limit_release(grant.grant_id, at_us=now_us())
        grant.released = True


def take_grant(journal: Journal, control: RunControl, tool_name: str, limit: Limit) -> Grant:
    """Wait for a grant of ``limit`` for a call of ``tool_name`` in the journal's run; the
    run ends while waiting when the worker stops or the lease is lost (:class:`Stop`)."""
    claim = journal.claim

    def stop_check() -> None:
        control.check_lease()
        control.check_stopping()

    limiter = Limiter(journal.store, claim.job_id, claim.attempt_id, stop_check=stop_check)
    return limiter.take(limit.name_for(tool_name), limit)


def release_in(tx: Transaction, grant: Grant | None) -> None:
    """Release ``grant`` in ``tx`` (a T2): the call it let start is over."""
    if grant is not None:
        tx.limit_release(grant.grant_id, at_us=now_us())


def declare_limits(store: Store, tools: ToolRegistry) -> None:
    """Declare the limits of ``tools`` (a worker starting): refused when two of them declare
    one name differently, or when the store's declaration of a name differs and is in use
    (store/limit_waits.py), so that every worker enforces one limit per name.

    Raises:
        ConfigError: a conflicting declaration, with a hint.
    """
    mine: dict[str, tuple[str, Declared]] = {}
    for tool_name in tools.names():
        t = tools.get(tool_name)
        if t is None or t.limit is None:
            continue
        name = t.limit.name_for(tool_name)
        declared = Declared(t.limit.rate_us, t.limit.concurrency)
        if name in mine and mine[name][1] != declared:
            raise ConfigError(
                f"limit {name!r} is declared twice: {mine[name][1].describe()} by "
                f"{mine[name][0]!r}, {declared.describe()} by {tool_name!r}",
                hint="Tools sharing a limit name must declare the same Limit: declare it once "
                "(shared = affidavit.Limit(..., name=...)) and pass it to each tool.",
            )
        mine[name] = (tool_name, declared)
    for name, (tool_name, declared) in sorted(mine.items()):
        with store.transaction(durable=False) as tx:
            theirs = declare_limit(tx, name, declared, now_us=now_us())
        if theirs is not None:
            raise ConfigError(
                f"limit {name!r} is in use as {theirs.describe()}; this worker's tool "
                f"{tool_name!r} declares {declared.describe()}",
                hint="Every worker must declare the same Limit for one name: load the same "
                "--tools code in all of them, or stop the workers using the other one and "
                f"start this one once the limit has been idle for {IN_USE_US // 1_000_000}s "
                "(see `affidavit limits list`).",
            )
