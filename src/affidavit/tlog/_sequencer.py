"""The sequencer: integrates queued seal leaves into the tree, in batches, one at a time.

Sealing only inserts a queue row (in the seal's transaction), so workers never serialize on the
tree. Whoever runs the sequencer (every worker, ``affidavit serve``, ``affidavit log
integrate``) first takes the lease in ``tlog_state``; while another owner holds a live lease it
does nothing. Each batch is one transaction: read the queued leaves, compute the new perfect
nodes from the old tree's frontier, write leaves and nodes, sign and store the checkpoint of
the new size, delete the integrated queue rows. The write is fenced on the lease owner and the
old size, so two sequencers can never both extend one tree. A crash anywhere loses nothing:
until the batch commits its leaves stay queued.

One leaf per record, first wins: a queued leaf whose job id (the leaf's ``job_id`` field,
which must be the queue row's) the tree already holds, or an earlier leaf of the same batch
holds, is not integrated. It is moved to ``tlog_rejected`` in the batch's transaction (as
evidence: ``affidavit log rejected``), reported as a warning naming the job and in
:attr:`Integrated.rejected`; the rest is integrated as usual. The store refuses such a leaf too
(migration 13).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.crash import crash_point
from affidavit.core.errors import ConfigError, StoreError, StoreUnavailable
from affidavit.core.events import utc_now
from affidavit.core.merkle import leaf_hash, new_nodes, root_from, root_nodes
from affidavit.core.note import NoteSigner, sign_note
from affidavit.store import QueuedLeaf, Store
from affidavit.tlog._keys import LogKey, configured_origin
from affidavit.tlog._leaves import record_id

log = logging.getLogger(__name__)

DEFAULT_BATCH = 5000
DEFAULT_INTERVAL_S = 0.5
DEFAULT_LEASE_S = 10.0


class _LostLease(Exception):
    """The lease passed to another sequencer, or the tree moved, mid-batch (rolled back)."""


@dataclass(frozen=True, slots=True)
class Integrated:
    """What one :meth:`Sequencer.integrate` did."""

    busy: bool  # another sequencer holds the lease: nothing done
    integrated: int
    size: int
    origin: str | None
    # queued leaves refused: (job id, reason, index of the job's logged leaf or None)
    rejected: tuple[tuple[str, str, int | None], ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "busy": self.busy,
            "integrated": self.integrated,
            "size": self.size,
            "origin": self.origin,
            "rejected": [
                {"job_id": job, "reason": reason, "first_index": first}
                for job, reason, first in self.rejected
            ],
        }


Refusal = tuple[QueuedLeaf, str, int | None]


def screen(
    batch: Sequence[QueuedLeaf], logged: dict[str, int], size: int
) -> tuple[list[QueuedLeaf], list[Refusal]]:
    """Split a queued batch into the leaves to integrate (at indices from ``size``) and those
    refused: a leaf whose record id is in ``logged`` (record id → index of its first leaf) or
    was taken by an earlier leaf of the batch (``duplicate``), or whose record id is missing,
    is not the queue row's job id, or that an entry bundle cannot hold (``malformed``)."""
    accepted: list[QueuedLeaf] = []
    refused: list[Refusal] = []
    seen = dict(logged)
    for q in batch:
        rid = record_id(q.leaf)
        if rid is None or rid != q.job_id:
            refused.append((q, "malformed", None))
        elif rid in seen:
            refused.append((q, "duplicate", seen[rid]))
        else:
            seen[rid] = size + len(accepted)
            accepted.append(q)
    return accepted, refused


def _report(refused: Sequence[Refusal]) -> list[tuple[str, str, int | None]]:
    """Warn of each refused leaf (once its batch committed), naming its job."""
    for q, reason, first in refused:
        if reason == "duplicate":
            log.warning(
                "sequencer: refused a second leaf for job %s (its leaf %s is logged; kept in "
                "tlog_rejected as seq %s)", q.job_id, first, q.seq,
            )  # fmt: skip
        else:
            log.warning(
                "sequencer: refused a malformed leaf queued for job %s (kept in tlog_rejected "
                "as seq %s)", q.job_id, q.seq,
            )  # fmt: skip
    return [(q.job_id, reason, first) for q, reason, first in refused]


class Sequencer:
    """Integrates the queue of ``store`` with the log key ``key``."""

    def __init__(
        self,
        store: Store,
        key: LogKey,
        *,
        origin: str | None = None,
        owner: str | None = None,
        batch_size: int = DEFAULT_BATCH,
        lease_seconds: float = DEFAULT_LEASE_S,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be ≥ 1")
        self.store = store
        self.key = key
        self.wanted_origin = configured_origin(origin)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds

    def _origin(self, stored: str | None) -> str:
        if stored is not None:
            if self.wanted_origin is not None and self.wanted_origin != stored:
                raise ConfigError(
                    f"this log's origin is {stored!r}, not {self.wanted_origin!r}",
                    hint="The origin is fixed by the first integration; unset "
                    "AFFIDAVIT_LOG_ORIGIN or --origin, or name the stored one.",
                )
            return stored
        return self.wanted_origin or self.key.default_origin()

    def pending(self) -> bool:
        """Whether there is anything to do (a cheap read: no lease, no write)."""
        with self.store.snapshot() as snap:
            state = snap.tlog_state()
            if state.origin is None or snap.tlog_queue_length() > 0:
                return True
            latest = snap.tlog_checkpoint()
            return latest is None or latest[0] != state.size

    def integrate(self, *, max_leaves: int | None = None) -> Integrated:
        """Take the lease and integrate what is queued (up to ``max_leaves``), batch by batch;
        then release the lease.

        Raises:
            ConfigError: the configured origin is not the log's.
            SigningKeyError: the log key cannot be read or created.
        """
        self.key.key()
        now = time.time()
        with self.store.transaction(durable=False) as tx:
            if not tx.tlog_take_lease(self.owner, now, now + self.lease_seconds):
                state = tx.tlog_state()
                return Integrated(True, 0, state.size, state.origin)
            state = tx.tlog_state()
            origin = self._origin(state.origin)
            if state.origin is None:
                tx.tlog_set_origin(origin)
        signer = self.key.signer(origin)
        total = 0
        size = state.size
        rejected: list[tuple[str, str, int | None]] = []
        try:
            while max_leaves is None or total < max_leaves:
                limit = self.batch_size
                if max_leaves is not None:
                    limit = min(limit, max_leaves - total)
                try:
                    done, size, refused = self._batch(
                        signer_origin=origin, signer=signer, limit=limit
                    )
                except _LostLease:
                    log.warning("sequencer %s lost its lease mid-batch", self.owner)
                    break
                total += done
                rejected.extend(_report(refused))
                if done == 0 and not refused:
                    break
        finally:
            with self.store.transaction(durable=False) as tx:
                tx.tlog_release_lease(self.owner)
        return Integrated(False, total, size, origin, tuple(rejected))

    def _batch(
        self, *, signer_origin: str, signer: NoteSigner, limit: int
    ) -> tuple[int, int, list[Refusal]]:
        with self.store.transaction(durable=True) as tx:
            state = tx.tlog_state()
            if state.lease_owner != self.owner:
                raise _LostLease
            queued = tx.tlog_queue_batch(limit)
            logged = tx.tlog_first_indices(q.job_id for q in queued)
            batch, refused = screen(queued, logged, state.size)
            if refused:
                tx.tlog_reject(refused, time.time())
            if not batch:
                latest = tx.tlog_checkpoint()
                if latest is None or latest[0] != state.size:
                    frontier = tx.tlog_nodes(root_nodes(state.size))
                    root = root_from(state.size, frontier)
                    note = sign_note(Checkpoint(signer_origin, state.size, root).text(), signer)
                    tx.tlog_store_checkpoint(state.size, note, utc_now())
                return 0, state.size, refused
            frontier = tx.tlog_nodes(root_nodes(state.size))
            created = new_nodes(state.size, [leaf_hash(q.leaf) for q in batch], frontier)
            new_size = state.size + len(batch)
            root = root_from(new_size, {**frontier, **created})
            note = sign_note(Checkpoint(signer_origin, new_size, root).text(), signer)
            crash_point("log.before_integrate")
            ok = tx.tlog_commit_batch(
                owner=self.owner,
                old_size=state.size,
                batch=batch,
                nodes=created,
                checkpoint=note,
                now=time.time(),
                created_at=utc_now(),
            )
            if not ok:
                raise _LostLease
            return len(batch), new_size, refused

    def run(self, stop: threading.Event, *, interval: float = DEFAULT_INTERVAL_S) -> None:
        """Integrate every ``interval`` seconds until ``stop`` is set (a background thread of
        a worker or the server). Store errors are logged and retried; they never stop it. An
        outage is one warning when it starts and one when the database is back, not one per
        try (a worker's runs and claim loops report it the same way)."""
        away = False  # the database was unavailable at the last try
        while not stop.is_set():
            try:
                if self.pending():
                    self.integrate()
                if away:
                    away = False
                    log.warning("sequencer: the database is reachable again")
            except StoreUnavailable as exc:
                (log.debug if away else log.warning)(
                    "sequencer: the database is unavailable (%s); trying again every %g s",
                    exc.message,
                    interval,
                )
                away = True
            except StoreError as exc:
                log.warning("sequencer: %s", exc.message)
            except Exception:
                log.exception("sequencer: integration failed")
            stop.wait(interval)

    def start(
        self, *, interval: float = DEFAULT_INTERVAL_S
    ) -> tuple[threading.Thread, threading.Event]:
        """:meth:`run` in a daemon thread; set the returned event to stop it."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self.run,
            args=(stop,),
            kwargs={"interval": interval},
            name="tlog-sequencer",
            daemon=True,
        )
        thread.start()
        return thread, stop
