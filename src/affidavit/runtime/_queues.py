"""Queues in the runtime: declared in code (:func:`queue`), written to the store where every
worker reads them, and claimed from by workers (:class:`QueueClaims`) within their limits
(see :mod:`affidavit.store.queues`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence

from affidavit.core.errors import ConfigError
from affidavit.core.rates import Rate
from affidavit.store import Store
from affidavit.store.base import Claimed
from affidavit.store.queues import (
    DEFAULT_QUEUE,
    QueueConfig,
    check_queue_name,
    claim_from_queue,
    get_queue,
    list_queues,
    queue_config,
    set_queue,
)

# Queues declared in code (the --tools module), written to a store when a runtime opens it.
_declared: dict[str, QueueConfig] = {}
_declared_lock = threading.Lock()
# How long a worker uses the list of queues it read before reading it again: a queue set
# while it runs is served within this long.
QUEUE_LIST_SECONDS = 2.0


def queue(
    name: str,
    *,
    concurrency: int | None = None,
    worker_concurrency: int | None = None,
    rate: str | Rate | None = None,
    priority: bool = False,
    partitioned: bool = False,
) -> QueueConfig:
    """Declare a queue: ``concurrency`` jobs running at once across every worker,
    ``worker_concurrency`` per worker process, ``rate`` (``"N/PERIOD"``) job starts in any
    sliding window of the period, ``priority`` (lower runs first), ``partitioned`` (one
    running job per partition key). Written to the database when a runtime opens it; a
    different configuration there is refused (change it with ``affidavit queues set``).

    Raises:
        ConfigError: a bad name or limit, or the same name declared otherwise here before.
    """
    config = queue_config(
        name,
        concurrency=concurrency,
        worker_concurrency=worker_concurrency,
        rate=rate,
        priority=priority,
        partitioned=partitioned,
    )
    with _declared_lock:
        before = _declared.get(name)
        if before is not None and before != config:
            raise ConfigError(
                f"queue {name!r} is declared twice, differently",
                hint="Declare each queue once.",
            )
        _declared[name] = config
    return config


def write_declared(store: Store) -> None:
    """Write the queues declared in code to ``store`` (a conflicting one is refused)."""
    with _declared_lock:
        configs = list(_declared.values())
    for config in configs:
        set_queue(store, config, replace=False)


def require_queue(store: Store, name: str) -> None:
    """Refuse a job for a queue the database does not know (its limits would be unknown).

    Raises:
        ConfigError: no such queue.
    """
    if name != DEFAULT_QUEUE and get_queue(store, name) is None:
        raise ConfigError(
            f"no queue {name!r} in the database",
            hint="Declare it with affidavit.queue(...) in the tools module or "
            f"`affidavit queues set {name}` first.",
        )


class QueueClaims:
    """A worker's claims from the named queues it serves (``names``: ``None``, every queue;
    else those, the default queue among them or not)."""

    def __init__(self, store: Store, names: Collection[str] | None = None) -> None:
        self.store = store
        self.names = None if names is None else tuple(check_queue_name(n) for n in names)
        self._lock = threading.Lock()
        self._known: tuple[str, ...] = ()
        self._read_at = -float("inf")
        self._turn = 0
        # when a queue's rate lets the next start of a job it held back (Unix time), if one did
        self._next_start: float | None = None

    @property
    def default(self) -> bool:
        """Whether the worker claims from the default queue."""
        return self.names is None or DEFAULT_QUEUE in self.names

    def any(self) -> bool:
        """Whether there are named queues to claim from (read as :meth:`queues` reads them)."""
        return bool(self.queues())

    def queues(self) -> Sequence[str]:
        """The named queues to claim from, in the order to try them now (each in turn first)."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= QUEUE_LIST_SECONDS:
                found = [c.name for c in list_queues(self.store)]
                if self.names is not None:
                    found = [n for n in found if n in self.names]
                self._known = tuple(found)
                self._read_at = now
            known = self._known
            if not known:
                return ()
            self._turn = (self._turn + 1) % len(known)
            return known[self._turn :] + known[: self._turn]

    def claim(
        self,
        *,
        owner: str,
        attempt_id: str,
        now: float,
        lease_seconds: float,
        job_id: str | None,
        skip: Collection[str],
    ) -> Claimed | None:
        held: list[float] = []
        for name in self.queues():
            claimed = claim_from_queue(
                self.store,
                name,
                owner=owner,
                attempt_id=attempt_id,
                now=now,
                lease_seconds=lease_seconds,
                job_id=job_id,
                skip=skip,
                held=held,
            )
            if claimed is not None:
                return claimed
        self._next_start = min(held) if held else None
        return None

    def rate_wait(self) -> float | None:
        """How long until a queue's rate lets a job it held back at the last claim start;
        ``None`` if none was held back so."""
        at = self._next_start
        return None if at is None else max(0.0, at - time.time())
