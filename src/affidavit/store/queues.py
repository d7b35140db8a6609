"""Queues with limits: their configuration, a job's place in one, and the claim that keeps the
limits (migration 18).

A job names its queue (``NULL``: the default queue, unlimited, claimed by the usual claim,
which never takes a job of another queue). A claim from a named queue runs in a transaction
of its own that first locks the queue's row (PostgreSQL ``FOR UPDATE``; SQLite's write
transaction holds the database's one write lock), so claims of one queue are serialized. Under
that lock it counts what the limits need — running jobs of the queue (``running`` with a live
lease: a job whose lease expired, or was handed back, holds no slot; waiting, parked and
sleeping jobs hold none), those of this worker, the starts in the rate's window — in a
statement of its own, so it sees everything the lock's previous holder committed. Only claims
take slots, and they all take this lock: the count a claim checks is the count it changes, and
``concurrency`` holds exactly. Nothing is counted by incrementing, so a killed worker leaks
nothing: its jobs' leases expire and they stop counting.

Each claim records its grant (``queue_grants``): the attempt, its owner, the slot (how many of
the queue's jobs were running before it), whether it started the job (a first claim, which
the rate counts) and when: ``claimed_at``, the worker's clock the limits were counted at,
and ``held_from``, the database's clock after the lock (migration 27), the clock its hold's
end is read from, so a hold never reads as starting before the end of the one it replaced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from affidavit.core.errors import ConfigError
from affidavit.core.events import utc_now
from affidavit.core.rates import Rate, parse_rate, window_start
from affidavit.store._ledger import RUNNABLE, claimed_from_row
from affidavit.store.base import Claimed, Store, Transaction

DEFAULT_QUEUE = "default"
MAX_PARTITION_KEY = 256
MAX_LIMIT = 1_000_000
# A priority is a 32-bit integer: lower runs first.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
_NAME_HINT = (
    "A queue name is 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit."
)
_LIVE = "status = 'running' AND lease_owner IS NOT NULL AND lease_expires_at >= ?"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue's limits; ``None``: unlimited."""

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate: Rate | None = None
    priority: bool = False
    partitioned: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "worker_concurrency": self.worker_concurrency,
            "rate": str(self.rate) if self.rate is not None else None,
            "priority": self.priority,
            "partitioned": self.partitioned,
        }


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job waits: its queue, priority, partition key, and the time (Unix seconds)
    before which it is not claimed."""

    queue: str
    priority: int = 0
    partition_key: str | None = None
    not_before: float | None = None


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"not a queue name: {name!r}", hint=_NAME_HINT)
    return name


def _limit(what: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ConfigError(
            f"a queue's {what} is an integer 1 .. {MAX_LIMIT}, not {value!r}",
            hint=f"Leave {what} out for no limit.",
        )
    return value


def queue_config(
    name: str,
    *,
    concurrency: int | None = None,
    worker_concurrency: int | None = None,
    rate: str | Rate | None = None,
    priority: bool = False,
    partitioned: bool = False,
) -> QueueConfig:
    """A checked :class:`QueueConfig`.

    Raises:
        ConfigError: a bad name, a limit that is not a positive integer, a malformed rate, or
            the default queue (unlimited, not configurable).
    """
    check_queue_name(name)
    if name == DEFAULT_QUEUE:
        raise ConfigError(
            "the default queue is unlimited and cannot be configured",
            hint="Declare a queue of another name and submit jobs to it with queue=NAME.",
        )
    parsed: Rate | None
    try:
        parsed = parse_rate(rate) if isinstance(rate, str) else rate
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return QueueConfig(
        name,
        _limit("concurrency", concurrency),
        _limit("worker_concurrency", worker_concurrency),
        parsed,
        bool(priority),
        bool(partitioned),
    )


def placement(
    queue: str | None,
    *,
    priority: int | None = None,
    partition_key: str | None = None,
    not_before: datetime | float | None = None,
) -> Placement | None:
    """A checked :class:`Placement`; ``None`` for the default queue with nothing else asked.

    Raises:
        ConfigError: a bad queue name, priority, partition key or time.
    """
    name = DEFAULT_QUEUE if queue is None else check_queue_name(queue)
    if priority is not None and (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]
    ):
        raise ConfigError(
            f"a priority is a 32-bit integer, not {priority!r}", hint="Lower runs first."
        )
    if partition_key is not None and (
        not isinstance(partition_key, str) or not 1 <= len(partition_key) <= MAX_PARTITION_KEY
    ):
        raise ConfigError(
            f"a partition key is text of 1 .. {MAX_PARTITION_KEY} characters",
            hint="Use an id such as customer-7.",
        )
    at = _seconds(not_before)
    if name == DEFAULT_QUEUE:
        if priority or partition_key is not None or at is not None:
            raise ConfigError(
                "priority, partition_key and not_before need a queue of their own",
                hint="Declare a queue (affidavit.queue or `affidavit queues set`) and pass queue=.",
            )
        return None
    return Placement(name, priority or 0, partition_key, at)


def _seconds(value: datetime | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigError(
                "not_before has no time zone", hint="Give an aware datetime, e.g. in UTC."
            )
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"not_before is a datetime, not {value!r}")
    return float(value)


def _config_from_row(row: Sequence[Any]) -> QueueConfig:
    name, concurrency, worker, count, period, priority, partitioned = row
    rate = Rate(int(count), float(period)) if count is not None else None
    return QueueConfig(
        name,
        None if concurrency is None else int(concurrency),
        None if worker is None else int(worker),
        rate,
        bool(priority),
        bool(partitioned),
    )


_CONFIG_COLUMNS = (
    "name, concurrency, worker_concurrency, rate_count, rate_period, priority, partitioned"
)


def _config_params(config: QueueConfig) -> tuple[Any, ...]:
    rate = config.rate
    return (
        config.name,
        config.concurrency,
        config.worker_concurrency,
        rate.count if rate is not None else None,
        rate.period_seconds if rate is not None else None,
        config.priority,
        config.partitioned,
    )


def set_queue(store: Store, config: QueueConfig, *, replace: bool = True) -> QueueConfig:
    """Write ``config``; with ``replace=False`` (a declaration in code) an existing queue of
    that name must have the same configuration.

    Raises:
        ConfigError: ``replace=False`` and the stored configuration differs.
    """
    with store.transaction() as tx:
        rows = tx.query(
            f"SELECT {_CONFIG_COLUMNS} FROM queues WHERE name = ?{_for_update(tx)}",
            (config.name,),
        )
        if rows:
            stored = _config_from_row(rows[0])
            if stored == config:
                return stored
            if not replace:
                raise ConfigError(
                    f"queue {config.name!r} is configured otherwise in the database: "
                    f"{stored.to_dict()}",
                    hint="Change it with `affidavit queues set` (every worker reads it from the "
                    "database), or declare the same configuration.",
                )
            tx.execute("DELETE FROM queues WHERE name = ?", (config.name,))
        tx.execute(
            f"INSERT INTO queues ({_CONFIG_COLUMNS}, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (*_config_params(config), utc_now()),
        )
    return config


def get_queue(store: Store, name: str) -> QueueConfig | None:
    with store.transaction(durable=False) as tx:
        rows = tx.query(f"SELECT {_CONFIG_COLUMNS} FROM queues WHERE name = ?", (name,))
    return _config_from_row(rows[0]) if rows else None


def list_queues(store: Store) -> list[QueueConfig]:
    with store.transaction(durable=False) as tx:
        rows = tx.query(f"SELECT {_CONFIG_COLUMNS} FROM queues ORDER BY name")
    return [_config_from_row(r) for r in rows]


def queue_stats(store: Store, config: QueueConfig, now: float) -> dict[str, Any]:
    """The queue's configuration with its pending, running and waiting jobs, and its starts
    in the last rate period (or the last minute, for a queue without a rate)."""
    period = config.rate.period_seconds if config.rate is not None else 60.0
    with store.transaction(durable=False) as tx:
        rows = tx.query(
            "SELECT "
            "(SELECT count(*) FROM jobs WHERE queue = ? AND status = 'pending'), "
            f"(SELECT count(*) FROM jobs WHERE queue = ? AND {_LIVE}), "
            "(SELECT count(*) FROM jobs WHERE queue = ? AND status = 'waiting'), "
            "(SELECT count(*) FROM queue_grants "
            "WHERE queue = ? AND started = ? AND claimed_at > ?)",
            (config.name, config.name, now, config.name, config.name, True, now - period),
        )
    pending, running, waiting, started = (int(v) for v in rows[0])
    return config.to_dict() | {
        "pending": pending,
        "running": running,
        "waiting": waiting,
        "started_in_period": started,
        "period_seconds": period,
    }


def place_job(tx: Transaction, job_id: str, where: Placement) -> None:
    """Put the job just created in ``tx`` in its queue."""
    tx.execute(
        "UPDATE jobs SET queue = ?, priority = ?, partition_key = ?, not_before = ? "
        "WHERE job_id = ?",
        (where.queue, where.priority, where.partition_key, where.not_before, job_id),
    )


def _for_update(tx: Transaction) -> str:
    return str(getattr(tx, "FOR_UPDATE", ""))


def claim_from_queue(
    store: Store,
    name: str,
    *,
    owner: str,
    attempt_id: str,
    now: float,
    lease_seconds: float,
    job_id: str | None = None,
    skip: Collection[str] = (),
    held: list[float] | None = None,
) -> Claimed | None:
    """Claim one runnable job of queue ``name`` within its limits (see the module's text);
    ``None`` if none is runnable or the limits allow none now (or the queue is not
    configured). ``held``: when the rate alone held a pending job back, the time its window
    lets the next start is appended to it."""
    with store.transaction(durable=False) as tx:
        if _for_update(tx):  # PostgreSQL: one statement after the lock, one round trip
            return _claim_in_one(
                tx, name, owner, attempt_id, now, lease_seconds, job_id, skip, held
            )
        rows = tx.query(f"SELECT {_CONFIG_COLUMNS} FROM queues WHERE name = ?", (name,))
        if not rows:
            return None
        config = _config_from_row(rows[0])
        running, mine, starts = live_counts(tx, config, owner, now)
        if config.concurrency is not None and running >= config.concurrency:
            return None
        if config.worker_concurrency is not None and mine >= config.worker_concurrency:
            return None
        may_start = config.rate is None or starts < config.rate.count
        found = _candidate(tx, config, now, may_start, job_id, skip)
        if found is None:
            if not may_start and held is not None and config.rate is not None:
                _next_start(tx, config.name, config.rate, now, held)
            return None
        claimed = claimed_from_row(found)
        started = not tx.query("SELECT 1 FROM queue_grants WHERE job_id = ?", (claimed.job_id,))
        reset = "" if claimed.recovered else ", recoveries = 0, recovery_progress = NULL"
        tx.execute(
            "UPDATE jobs SET status = 'running', attempt_id = ?, lease_owner = ?, "
            f"lease_expires_at = ?, updated_at = ?{reset} WHERE job_id = ?",
            (attempt_id, owner, now + lease_seconds, utc_now(), claimed.job_id),
        )
        tx.execute(
            "INSERT INTO queue_grants (queue, job_id, attempt_id, owner, slot, started, "
            f"claimed_at, held_from) VALUES (?, ?, ?, ?, ?, ?, ?, {_DB_NOW_SQLITE})",
            (name, claimed.job_id, attempt_id, owner, running, started, now),
        )
        return claimed


def _claim_in_one(
    tx: Transaction,
    name: str,
    owner: str,
    attempt_id: str,
    now: float,
    lease_seconds: float,
    job_id: str | None,
    skip: Collection[str],
    held: list[float] | None,
) -> Claimed | None:
    """The claim as one statement after the queue's lock, both sent with the commit in one
    round trip: the lock is a statement of its own, so under READ COMMITTED the claim's
    snapshot (taken when it starts, after the lock is granted) holds everything the lock's
    previous holder committed."""
    tx.execute(f"SELECT name FROM queues WHERE name = ?{_for_update(tx)}", (name,))
    filters, params = _filters(now, job_id, skip)
    claim = _ONE_CLAIM.format(live=_LIVE, live_o=_LIVE_O, runnable=RUNNABLE, filters=filters)
    bound = [
        name,
        name,
        now,
        name,
        now,
        owner,
        name,
        True,
        now,  # q, n
        now,
        now,
        now,
        now,
        *params,  # c
        attempt_id,
        owner,
        now + lease_seconds,
        utc_now(),  # u
        name,
        attempt_id,
        owner,
        now,  # g
        now,  # the oldest start
    ]
    commit_with_next_read = getattr(tx, "commit_with_next_read", None)
    if commit_with_next_read is not None:
        commit_with_next_read()
    rows = tx.query(claim, bound)
    if not rows:  # no such queue
        return None
    row = rows[0]
    if row[0] is None:
        oldest, pending, period = row[5], row[6], row[7]
        if held is not None and oldest is not None and pending and period is not None:
            held.append(float(oldest) + float(period))
        return None
    return claimed_from_row(row[:5])


_LIVE_O = "o." + _LIVE.replace(" AND ", " AND o.")
# The database's clock in Unix seconds (SQLite; the claim's writer lock is already held): a
# grant's ``held_from``, the clock its hold's end is read from (migration 27).
_DB_NOW_SQLITE = "(julianday('now') - 2440587.5) * 86400.0"
# A job not started yet: no claim of it was granted before (its first claim is its start).
_NOT_STARTED = "NOT EXISTS (SELECT 1 FROM queue_grants p WHERE p.job_id = j.job_id)"
# The claim from a queue, one statement (PostgreSQL): the queue's configuration (q), its counts
# (n), the first runnable job within the limits (c), its lease (u) and its grant (g); one row
# (none without the queue): the claimed job's columns (NULLs if none), then, for a rate that
# held a job back, the oldest start in its window, whether jobs are pending, the period.
_ONE_CLAIM = (
    "WITH q AS (SELECT * FROM queues WHERE name = ?), "
    "n AS (SELECT (SELECT count(*) FROM jobs WHERE queue = ? AND {live}) AS running, "
    "(SELECT count(*) FROM jobs WHERE queue = ? AND {live} AND lease_owner = ?) AS mine, "
    "(SELECT count(*) FROM queue_grants g, q WHERE g.queue = ? AND g.started = ? "
    "AND g.claimed_at > ? - q.rate_period) AS starts), "
    "c AS (SELECT j.job_id, j.status, j.lease_owner, j.recoveries, j.recovery_progress "
    "FROM jobs j, q, n WHERE j.queue = q.name AND {runnable} "
    "AND (j.not_before IS NULL OR j.not_before <= ?) "
    "AND (q.concurrency IS NULL OR n.running < q.concurrency) "
    "AND (q.worker_concurrency IS NULL OR n.mine < q.worker_concurrency) "
    f"AND (q.rate_count IS NULL OR n.starts < q.rate_count OR NOT {_NOT_STARTED}) "
    "AND (NOT q.partitioned OR j.partition_key IS NULL OR (NOT EXISTS (SELECT 1 FROM jobs o "
    "WHERE o.queue = j.queue AND o.partition_key = j.partition_key AND o.job_id <> j.job_id "
    "AND {live_o}) AND (j.status <> 'pending' OR NOT EXISTS (SELECT 1 FROM jobs o "
    "WHERE o.queue = j.queue AND o.partition_key = j.partition_key AND o.status = 'pending' "
    "AND (o.created_at < j.created_at OR (o.created_at = j.created_at AND o.job_id < j.job_id))"
    ")))){filters} "
    "ORDER BY CASE WHEN q.priority THEN j.priority ELSE 0 END, j.created_at, j.job_id "
    "LIMIT 1 FOR UPDATE OF j SKIP LOCKED), "
    "u AS (UPDATE jobs SET status = 'running', attempt_id = ?, lease_owner = ?, "
    "lease_expires_at = ?, updated_at = ?, "
    "recoveries = CASE WHEN c.status = 'running' AND c.lease_owner IS NOT NULL "
    "THEN c.recoveries ELSE 0 END, "
    "recovery_progress = CASE WHEN c.status = 'running' AND c.lease_owner IS NOT NULL "
    "THEN c.recovery_progress END "
    "FROM c WHERE jobs.job_id = c.job_id RETURNING c.job_id, c.status, c.lease_owner, "
    "c.recoveries, c.recovery_progress), "
    "g AS (INSERT INTO queue_grants (queue, job_id, attempt_id, owner, slot, started, "
    "claimed_at, held_from) SELECT ?, u.job_id, ?, ?, n.running, "
    f"{_NOT_STARTED.replace('j.job_id', 'u.job_id')}, ?, "
    "extract(epoch FROM clock_timestamp())::double precision FROM u, n) "
    "SELECT u.job_id, u.status, u.lease_owner, u.recoveries, u.recovery_progress, "
    "CASE WHEN u.job_id IS NULL AND n.starts >= q.rate_count THEN "
    "(SELECT min(claimed_at) FROM queue_grants WHERE queue = q.name AND started "
    "AND claimed_at > ? - q.rate_period) END, "
    "CASE WHEN u.job_id IS NULL AND n.starts >= q.rate_count THEN EXISTS (SELECT 1 FROM jobs "
    "WHERE queue = q.name AND status = 'pending') END, q.rate_period "
    "FROM q CROSS JOIN n LEFT JOIN u ON true"
)


def _filters(now: float, job_id: str | None, skip: Collection[str]) -> tuple[str, list[Any]]:
    sql, params = "", []
    if job_id is not None:
        sql += " AND j.job_id = ?"
        params.append(job_id)
    if skip:
        sql += f" AND j.job_id NOT IN ({', '.join('?' * len(skip))})"
        params.extend(skip)
    return sql, params


def live_counts(
    tx: Transaction, config: QueueConfig, owner: str, now: float
) -> tuple[int, int, int]:
    """The queue's running jobs, this owner's, and the starts in the rate's window (after the
    queue's lock: a statement of its own)."""
    rate = config.rate
    begin = window_start(rate, now) if rate is not None else now
    rows = tx.query(
        f"SELECT (SELECT count(*) FROM jobs WHERE queue = ? AND {_LIVE}), "
        f"(SELECT count(*) FROM jobs WHERE queue = ? AND {_LIVE} AND lease_owner = ?), "
        "(SELECT count(*) FROM queue_grants WHERE queue = ? AND started = ? AND claimed_at > ?)",
        (config.name, now, config.name, now, owner, config.name, True, begin),
    )
    running, mine, starts = rows[0]
    return int(running), int(mine), int(starts) if rate is not None else 0


def get_config_for_update(tx: Transaction, name: str) -> QueueConfig | None:
    """Queue ``name``'s configuration, its row locked for this transaction (claims of the queue
    wait for it); ``None`` if the queue is not configured."""
    rows = tx.query(
        f"SELECT {_CONFIG_COLUMNS} FROM queues WHERE name = ?{_for_update(tx)}", (name,)
    )
    return _config_from_row(rows[0]) if rows else None


def partition_taken(tx: Transaction, queue: str, key: str, job_id: str, now: float) -> bool:
    """Whether a job of ``queue`` other than ``job_id`` runs in partition ``key`` at ``now``."""
    rows = tx.query(
        f"SELECT 1 FROM jobs WHERE queue = ? AND partition_key = ? AND job_id <> ? AND {_LIVE}",
        (queue, key, job_id, now),
    )
    return bool(rows)


def _next_start(tx: Transaction, name: str, rate: Rate, now: float, held: list[float]) -> None:
    rows = tx.query(
        "SELECT (SELECT min(claimed_at) FROM queue_grants "
        "WHERE queue = ? AND started = ? AND claimed_at > ?), "
        "(SELECT count(*) FROM jobs WHERE queue = ? AND status = 'pending' "
        "AND (not_before IS NULL OR not_before <= ?))",
        (name, True, window_start(rate, now), name, now),
    )
    oldest, pending = rows[0]
    if oldest is not None and int(pending):
        held.append(float(oldest) + rate.period_seconds)


def _candidate(
    tx: Transaction,
    config: QueueConfig,
    now: float,
    may_start: bool,
    job_id: str | None,
    skip: Collection[str],
) -> Sequence[Any] | None:
    sql = (
        "SELECT j.job_id, j.status, j.lease_owner, j.recoveries, j.recovery_progress "
        f"FROM jobs j WHERE j.queue = ? AND {RUNNABLE} "
        "AND (j.not_before IS NULL OR j.not_before <= ?)"
    )
    params: list[Any] = [config.name, now, now, now]
    if not may_start:  # the rate's window is full: only jobs started before (resumed, recovered)
        sql += f" AND NOT {_NOT_STARTED}"
    if config.partitioned:
        # one running job per partition, started in submission order
        sql += (
            " AND (j.partition_key IS NULL OR (NOT EXISTS (SELECT 1 FROM jobs o "
            "WHERE o.queue = j.queue AND o.partition_key = j.partition_key "
            f"AND o.job_id <> j.job_id AND o.{_LIVE.replace(' AND ', ' AND o.')}) "
            "AND (j.status <> 'pending' OR NOT EXISTS (SELECT 1 FROM jobs o "
            "WHERE o.queue = j.queue AND o.partition_key = j.partition_key "
            "AND o.status = 'pending' AND (o.created_at < j.created_at "
            "OR (o.created_at = j.created_at AND o.job_id < j.job_id))))))"
        )
        params.append(now)
    if job_id is not None:
        sql += " AND j.job_id = ?"
        params.append(job_id)
    if skip:
        sql += f" AND j.job_id NOT IN ({', '.join('?' * len(skip))})"
        params.extend(skip)
    order = "j.priority, " if config.priority else ""
    sql += f" ORDER BY {order}j.created_at, j.job_id LIMIT 1{getattr(tx, 'SKIP_LOCKED', '')}"
    rows = tx.query(sql, params)
    return rows[0] if rows else None


def recorded_grants(store: Store, name: str, since: float) -> list[dict[str, Any]]:
    """The grants of queue ``name`` claimed at ``since`` or later, oldest first."""
    with store.transaction(durable=False) as tx:
        rows = tx.query(
            "SELECT job_id, attempt_id, owner, slot, started, claimed_at FROM queue_grants "
            "WHERE queue = ? AND claimed_at >= ? ORDER BY claimed_at, job_id",
            (name, since),
        )
    return [
        {
            "job_id": r[0],
            "attempt_id": r[1],
            "owner": r[2],
            "slot": int(r[3]),
            "started": bool(r[4]),
            "claimed_at": float(r[5]),
        }
        for r in rows
    ]
