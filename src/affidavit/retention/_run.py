"""Applying the retention policy: old finished jobs leave the live store, each only once its
pack is in the archive and verified.

For each job that finished before the policy's age and may be removed (sealed, its seal in the
transparency log, no hold, no child still running, no parent still in the live store):

(1) its pack is exported and written into the archive whole (a temporary file, flushed,
    renamed over ``pack-<job>.tar.gz``, the directory flushed) — crash point
    ``retention.after_pack_written``;
(2) the file is read back and verified: MATCH with a seal signed by a key the store records,
    and it carries this job's seal, status, chain head and length — crash point
    ``retention.after_pack_verified``;
(3) one transaction locks the job row, checks (again) that the job may be removed, writes the
    tombstone (the seal's hash, the pack's path and the file's SHA-256) and deletes the job's
    rows (see :func:`affidavit.store.retention.remove_job_txn`) — crash points
    ``retention.before_delete_commit`` (inside it: rolled back) and
    ``retention.after_delete_commit``.

A crash before (3) commits leaves the job in the live store, whole, and perhaps its pack in the
archive: the next run writes the pack again (over it) and goes on. A crash after it leaves the
job archived. Nothing is ever deleted that is not in a verified pack on disk (or, with no
archive, nothing is kept but the tombstone and the seal: the policy said so). One worker at a
time runs retention, under the lease in ``retention_policy``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from affidavit.core import crash
from affidavit.core.errors import AffidavitError, JobNotFound, StoreError, StoreUnavailable
from affidavit.core.events import utc_now
from affidavit.core.seal import seal_sha256
from affidavit.core.signing import SigningKey
from affidavit.retention._archive import (
    PackRecord,
    pack_file,
    pack_problem,
    sha256_file,
    write_durably,
)
from affidavit.retention._policy import RetentionError, RetentionPolicy, read_policy
from affidavit.store import Store
from affidavit.store.retention import (
    Rows,
    Tombstone,
    due_job_ids,
    lease_release,
    lease_take,
    remove_job_txn,
    why_kept,
)

log = logging.getLogger("affidavit.retention")

DEFAULT_LEASE_S = 60.0
DEFAULT_INTERVAL_S = 60.0
BATCH = 50  # jobs selected at a time
RETENTION_ENV = "AFFIDAVIT_RETENTION"
INTERVAL_ENV = "AFFIDAVIT_RETENTION_INTERVAL"


@dataclass(slots=True)
class RunReport:
    """What one :meth:`Retention.run` did: ``archived`` the jobs removed (each with its pack's
    path, or ``None`` with no archive), ``failed`` the jobs kept because their pack could not be
    written or verified (job → why), ``skipped`` those that changed meanwhile (job → why)."""

    policy: RetentionPolicy | None = None
    busy: bool = False  # another worker holds retention's lease
    archived: dict[str, str | None] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": None if self.policy is None else self.policy.to_dict(),
            "busy": self.busy,
            "archived": len(self.archived),
            "jobs": self.archived,
            "failed": self.failed,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
        }


class Retention:
    """Applies ``store``'s retention policy (see the module docstring). ``signing_key``: the
    key packs are signed with (default: the runtime's seal key for this database, as
    ``affidavit pack export``). ``clock``: Unix seconds."""

    def __init__(
        self,
        store: Store,
        *,
        signing_key: SigningKey | None = None,
        owner: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.store = store
        self.signing_key = signing_key
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.clock = clock

    def run(self, *, limit: int | None = None) -> RunReport:
        """Archive and remove every due job (at most ``limit``), under the lease; a run that
        finds another worker holding it does nothing (``busy``).

        Raises:
            RetentionError: no policy is set, or the archive directory cannot be written.
            StoreError: the database failed (what committed stays committed).
        """
        started = time.monotonic()
        report = RunReport(policy=read_policy(self.store))
        policy = report.policy
        if policy is None:
            raise RetentionError(
                "no retention policy is set",
                hint="Set one: `affidavit retention set --finished-older-than 90d --archive DIR`.",
            )
        if policy.archive_dir is not None and not policy.archive_dir.is_dir():
            raise RetentionError(
                f"the archive directory {str(policy.archive_dir)!r} does not exist",
                hint="Mount it, or set the policy again with the directory to use.",
            )
        if not self._take_lease():
            report.busy = True
            return report
        try:
            self._run(policy, limit, report)
        finally:
            report.seconds = time.monotonic() - started
            with self.store.transaction(durable=False) as tx:
                lease_release(tx, self.owner, len(report.archived))
        return report

    def _take_lease(self) -> bool:
        now = self.clock()
        with self.store.transaction(durable=False) as tx:
            return lease_take(tx, self.owner, now, now + self.lease_seconds)

    def _run(self, policy: RetentionPolicy, limit: int | None, report: RunReport) -> None:
        passed: set[str] = set()  # failed or skipped this run: not selected again
        while limit is None or len(report.archived) < limit:
            cutoff = policy.finished_before(self.clock())
            with self.store.snapshot() as snap:
                due = due_job_ids(cast(Rows, snap), cutoff, BATCH + len(passed))
            due = [j for j in due if j not in passed]
            if not due:
                return
            for job_id in due:
                if limit is not None and len(report.archived) >= limit:
                    return
                if not self._take_lease():  # (renewed per job: a slow archive keeps it)
                    report.busy = True
                    return
                self._one(job_id, policy, cutoff, report)
                if job_id not in report.archived:
                    passed.add(job_id)

    def _one(self, job_id: str, policy: RetentionPolicy, cutoff: str, report: RunReport) -> None:
        try:
            job = self.store.get_job(job_id)
        except JobNotFound:
            report.skipped[job_id] = "no such job in the live store"
            return
        seal = self.store.get_seal(job_id)
        if seal is None:
            report.skipped[job_id] = "not sealed"
            return
        sealed = seal_sha256(seal)
        path: Path | None = None
        digest: str | None = None
        if policy.archive_dir is not None:
            from affidavit.packs import export_archive

            path = pack_file(policy.archive_dir, job_id)
            try:
                data, _ = export_archive(self.store, job_id, signing_key=self.signing_key)
                write_durably(path, data)
            except (AffidavitError, OSError) as exc:
                report.failed[job_id] = f"the pack could not be written: {_why(exc)}"
                log.warning("retention: job %s kept: %s", job_id, report.failed[job_id])
                return
            crash.crash_point("retention.after_pack_written")
            keys = [k.public_key for k in self.store.signing_keys()]
            record = PackRecord(job.status, job.head_hash, job.version, sealed)
            problem = pack_problem(path, keys, seal_hash=sealed, record=record)
            if problem is not None:
                report.failed[job_id] = problem
                log.warning("retention: job %s kept: %s", job_id, problem)
                return
            digest = sha256_file(path)
            crash.crash_point("retention.after_pack_verified")
        tombstone = Tombstone(
            job_id,
            job.namespace,
            job.plan_name,
            job.status,
            job.created_at,
            sealed,
            None if path is None else str(path),
            digest,
            utc_now(),
            job.idempotency_key,
        )
        with self.store.transaction() as tx:
            locked = tx.get_job(job_id, for_update=True)
            kept = why_kept(cast(Rows, tx), job_id)
            now_sealed = tx.seal_get(job_id)
            if locked is None or kept is not None:
                report.skipped[job_id] = kept or "no such job in the live store"
                return
            if (locked.version, locked.status, locked.updated_at) != (
                job.version,
                job.status,
                job.updated_at,
            ) or locked.updated_at >= cutoff:
                report.skipped[job_id] = "the job changed while its pack was written"
                return
            if now_sealed is None or seal_sha256(now_sealed) != sealed:
                report.skipped[job_id] = "the job's seal changed while its pack was written"
                return
            remove_job_txn(tx, job_id, tombstone)
            crash.crash_point("retention.before_delete_commit")  # (rolled back)
        crash.crash_point("retention.after_delete_commit")
        report.archived[job_id] = tombstone.pack_path


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, AffidavitError) else str(exc)


def retention_enabled() -> bool:
    """Whether workers run retention (``$AFFIDAVIT_RETENTION`` is not ``off``)."""
    return os.environ.get(RETENTION_ENV, "").lower() not in ("off", "0", "false", "no")


def _interval_from_env() -> float:
    text = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        value = DEFAULT_INTERVAL_S
    return value if 0.05 <= value <= 86_400 else DEFAULT_INTERVAL_S


def run_periodically(retention: Retention, stop: threading.Event, interval: float) -> None:
    """Run ``retention`` every ``interval`` seconds while a policy is set, until ``stop``;
    errors are logged and the next round tried."""
    while not stop.is_set():
        try:
            if read_policy(retention.store) is not None:
                report = retention.run()
                if report.archived or report.failed:
                    log.info(
                        "retention: %d job(s) archived, %d kept on a failure",
                        len(report.archived),
                        len(report.failed),
                    )
        except StoreUnavailable as exc:
            log.debug("retention: the database is unavailable (%s)", exc.message)
        except (RetentionError, StoreError) as exc:
            log.warning("retention: %s", exc.message)
        except Exception:
            log.exception("retention: a run failed")
        stop.wait(interval)


@contextmanager
def background_retention(
    store: Store, *, interval: float | None = None, lease_seconds: float = DEFAULT_LEASE_S
) -> Iterator[Retention | None]:
    """Run retention in a daemon thread while the body runs (a worker): every ``interval``
    seconds (default ``$AFFIDAVIT_RETENTION_INTERVAL``, else 60), only while a policy is set,
    one worker at a time. Nothing runs when ``$AFFIDAVIT_RETENTION`` is ``off``."""
    if not retention_enabled():
        yield None
        return
    retention = Retention(store, lease_seconds=lease_seconds)
    stop = threading.Event()
    thread = threading.Thread(
        target=run_periodically,
        args=(retention, stop, _interval_from_env() if interval is None else interval),
        name="retention",
        daemon=True,
    )
    thread.start()
    try:
        yield retention
    finally:
        stop.set()
        thread.join()
