"""The :class:`Runtime`: submit jobs, run them, and the human decisions on them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from affidavit.core.approvals import Principal, operator
from affidavit.core.config import DEFAULT_NAMESPACE, database_url
from affidavit.core.errors import PlanError
from affidavit.core.parks import RESUME_DECISIONS
from affidavit.core.plan import Plan
from affidavit.core.privacy import KeyProvider, master_key_provider
from affidavit.core.signing import SigningKey
from affidavit.record import Sealer, follow_job
from affidavit.runtime._agent import Agent
from affidavit.runtime._cancel import request_cancel
from affidavit.runtime._confirm import ResourceVerifier
from affidavit.runtime._decisions import (
    InvalidStateError,
    resume_job,
    signal_job,
)
from affidavit.runtime._fork import _SAME_INPUT, fork_job
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._queues import require_queue, write_declared
from affidavit.runtime._run_base import DEFAULT_MAX_RECOVERIES, DEFAULT_STORE_RETRY_SECONDS
from affidavit.runtime._sdk import Tool, ToolRegistry, registry
from affidavit.runtime._submit import check_plan, submit_agent_job, submit_job
from affidavit.runtime._waiting import wait_for_job
from affidavit.runtime._worker import DEFAULT_LEASE_SECONDS, Worker
from affidavit.store import JobRecord, Store, StoredEvent, open_store
from affidavit.store.queues import placement

__all__ = ["RESUME_DECISIONS", "InvalidStateError", "Runtime"]


class Runtime:
    """One database and one tool registry.

    ``Runtime("sqlite:///./affidavit.db", tools=[...], verifiers=[...])``; ``tools`` defaults
    to every tool (and resource verifier) registered in the module-level registry;
    ``signing_key`` (a :class:`SigningKey` or a key file path) signs the seal of every job that
    finishes, by default the key file of :func:`~affidavit.record._sealing.default_key_path`
    (created on first use);
    ``verifiers`` adds resource verifiers for confirmation replay. ``step_concurrency`` runs up
    to that many independent nodes of a job at once (default 1: one node at a time).
    ``store_retry_seconds``: how long a run keeps trying a write while the database is
    unavailable (a restart, a failover, a lock held past the busy timeout) before it gives up
    and leaves the job to be reclaimed.
    ``max_recoveries``: how many times in a row a job is recovered after a run that ended
    without handing it back or recording a step's outcome (a step that kills its worker)
    before it is parked (reason ``crash_loop``) instead of run again.
    ``max_outage_seconds``: how long :meth:`run_until_idle` (and the worker's loops) keep
    waiting for a database that stays unavailable before raising ``StoreUnavailable``
    (default ``None``: until it is back).
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tools: ToolRegistry | Iterable[Tool | Agent] | None = None,
        store: Store | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        verifiers: Iterable[ResourceVerifier] = (),
        step_concurrency: int = 1,
        signing_key: SigningKey | Path | str | None = None,
        store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        max_outage_seconds: float | None = None,
        queues: Iterable[str] | None = None,
        master_key: KeyProvider | Path | str | None = None,
    ) -> None:
        if tools is None:
            self.tools = registry
        elif isinstance(tools, ToolRegistry):
            self.tools = tools
        else:
            self.tools = ToolRegistry(tools)
        verifiers = list(verifiers)
        if verifiers:
            self.tools = self.tools.with_verifiers(verifiers)
        self.metrics = RuntimeMetrics()
        self.store = store if store is not None else open_store(database_url(db_url))
        if master_key is not None:  # (else $AFFIDAVIT_MASTER_KEY, when a subject needs one)
            self.store.subjects.use(master_key_provider(master_key))
        self._closed = False
        if isinstance(signing_key, SigningKey):
            self.sealer = Sealer(key=signing_key)
        elif signing_key is not None:
            self.sealer = Sealer(signing_key)
        else:
            self.sealer = Sealer.for_store(self.store)
        self.worker = Worker(
            self.store,
            self.tools,
            lease_seconds=lease_seconds,
            worker_id=worker_id,
            metrics=self.metrics,
            step_concurrency=step_concurrency,
            sealer=self.sealer,
            store_retry_seconds=store_retry_seconds,
            max_recoveries=max_recoveries,
            max_outage_seconds=max_outage_seconds,
            queues=None if queues is None else tuple(queues),
        )
        write_declared(self.store)  # (queues declared in code: see affidavit.queue)

    def close(self) -> None:
        self._closed = True
        self.store.close()

    def _check_open(self) -> None:
        # Every method refuses the same way once closed (the store would say "the store is
        # closed" as a StoreError, which reads like a database problem); and a closed store
        # fails every claim: the run loop, which outlives a failing job, would otherwise log
        # that failure forever instead of returning.
        if self._closed:
            raise InvalidStateError(
                "this Runtime is closed", hint="Open a new Runtime to run jobs."
            )

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- submit -------------------------------------------------------------------------------

    def check_plan(self, plan: Plan) -> None:
        """Every tool and pure node names a registered function of the right kind.

        Raises:
            PlanError: naming the node and the tool.
        """
        check_plan(plan, self.tools)

    def submit(
        self,
        plan: Plan | Agent | Mapping[str, Any] | str | Path,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        submitted_by: str | None = None,
        replay_verification: str | None = None,
        traceparent: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        partition_key: str | None = None,
        not_before: datetime | None = None,
        tags: Mapping[str, str] | None = None,
        subject: str | None = None,
    ) -> JobRecord:
        """Validate and enqueue a job; the same ``idempotency_key`` returns the same job.
        Nothing is written unless the plan, its tools and the input are all valid. See
        :func:`~affidavit.runtime._submit.submit_job`.

        ``plan`` may also be an agent (:func:`affidavit.agent`) or the name of a registered
        one: the job runs that agent function with ``input`` as its keyword arguments (see
        :func:`~affidavit.runtime._submit.submit_agent_job`).

        ``queue``: the queue the job waits in (default: the default queue, unlimited), where
        it is claimed lowest ``priority`` first (when the queue orders by priority), at most
        one running job per ``partition_key`` (a partitioned queue), and not before
        ``not_before`` (see docs/queues.md).

        ``tags``: up to 16 ``key → value`` texts to list the job by (``jobs list --tag``);
        stored in plain text, never encrypted — they must not hold personal data (see
        :mod:`affidavit.core.tags`).
        ``subject`` (agent jobs): the person the job's data is about; its values are stored
        sealed under the subject's key, erasable with ``affidavit erase`` (docs/privacy.md)."""
        self._check_open()
        where = placement(
            queue, priority=priority, partition_key=partition_key, not_before=not_before
        )
        if where is not None:
            require_queue(self.store, where.queue)
        if isinstance(plan, Agent) or (
            isinstance(plan, str) and self.tools.get_agent(plan) is not None
        ):
            job, _ = submit_agent_job(
                self.store,
                plan,
                input,
                tools=self.tools,
                idempotency_key=idempotency_key,
                namespace=namespace,
                submitted_by=submitted_by,
                replay_verification=replay_verification,
                traceparent=traceparent,
                placement=where,
                tags=tags,
                subject=subject,
            )
            return job
        job, _ = submit_job(
            self.store,
            plan,
            input,
            tools=self.tools,
            idempotency_key=idempotency_key,
            namespace=namespace,
            submitted_by=submitted_by,
            replay_verification=replay_verification,
            traceparent=traceparent,
            placement=where,
            tags=tags,
            subject=subject,
        )
        return job

    # --- run ----------------------------------------------------------------------------------

    def run_until_idle(self, *, concurrency: int = 1) -> int:
        """Run runnable jobs until none is left; return how many runs were made.

        Raises:
            StoreUnavailable: the database stayed unavailable for ``max_outage_seconds``
                (only when that is set; see :meth:`Worker.run`).
        """
        self._check_open()
        before = self.worker.jobs_run
        self.worker.run(until_idle=True, concurrency=concurrency)
        return self.worker.jobs_run - before

    def run_job(self, job_id: str) -> JobRecord:
        """Run one job in this process until it completes, fails, waits or parks (a job that
        is not runnable — finished, or leased by a live worker — is returned as it is).

        Raises:
            PlanError: the job's remaining nodes need tools this runtime does not have (the
                job is left as it was, for a worker that has them).
        """
        self._check_open()
        if self.worker.run_once(job_id) == "unrunnable":
            missing = self.worker.last_missing
            raise PlanError(
                f"job {job_id} needs {', '.join(missing)}, which are not registered here",
                hint="Load the module that defines them with --tools.",
            )
        return self.store.get_job(job_id)

    def get_job(self, job_id: str) -> JobRecord:
        self._check_open()
        return self.store.get_job(job_id)

    def wait(
        self, job_id: str, *, timeout: float | None = None, poll_seconds: float = 0.5
    ) -> JobRecord:
        """Wait until a job that workers run elsewhere is settled — finished (``completed``,
        ``failed``, ``cancelled``) or needing a person (``waiting``, ``parked``) — and return
        it. See :func:`~affidavit.runtime._waiting.wait_for_job`.

        Raises:
            JobNotFound: no such job.
            WaitTimeout: still pending or running after ``timeout`` seconds.
            StoreUnavailable: the database stayed unavailable for the runtime's
                ``store_retry_seconds`` (the wait rides out shorter outages).
        """
        self._check_open()
        return wait_for_job(
            self.store,
            job_id,
            timeout=timeout,
            poll_seconds=poll_seconds,
            store_retry_seconds=self.worker.store_retry_seconds,
        )

    def follow(
        self, job_id: str, after_version: int = 0, *, timeout: float | None = None
    ) -> Iterator[StoredEvent]:
        """Every event of ``job_id`` after ``after_version`` as it is recorded — its
        ``stream_emitted`` values among them (``ctx.emit``) — until the job is finished, waits
        or is parked, or ``timeout`` seconds passed: what ``affidavit jobs watch`` prints. See
        :func:`affidavit.record.follow_job`.

        Raises:
            JobNotFound: no such job.
            StoreError: the database failed.
        """
        self._check_open()
        return follow_job(self.store, job_id, after_version, timeout=timeout)

    # --- human decisions (the service functions of :mod:`affidavit.runtime._decisions`) ---------

    def signal(
        self,
        job_id: str,
        key: str,
        payload: Any = None,
        *,
        by: str | None = None,
        approver: Principal | str | None = None,
    ) -> JobRecord:
        """Complete the wait whose correlation key is ``key`` with ``payload``; the job becomes
        runnable. A repeated signal returns the job and writes nothing. An approval is decided
        by ``approver``: a :class:`~affidavit.core.approvals.Principal`, or a name, which
        decides as the operator ``operator:NAME`` (role admin) does from the CLI. See
        :func:`~affidavit.runtime._decisions.signal_job`."""
        self._check_open()
        who = operator(approver) if isinstance(approver, str) else approver
        job, _ = signal_job(self.store, job_id, key, payload, by=by, principal=who)
        return job

    def fork(
        self,
        job_id: str,
        from_step: str,
        input: Any = _SAME_INPUT,
        *,
        submitted_by: str | None = None,
        idempotency_key: str | None = None,
    ) -> JobRecord:
        """A new job reusing sealed job ``job_id``'s recorded steps up to and including
        ``from_step`` and running the rest with the tools (and the version of its agent)
        registered now (the same ``idempotency_key`` returns the same fork); see
        :func:`~affidavit.runtime._fork.fork_job`."""
        self._check_open()
        return fork_job(
            self.store,
            job_id,
            from_step,
            input,
            submitted_by=submitted_by,
            tools=self.tools,
            idempotency_key=idempotency_key,
        )

    def cancel(
        self,
        job_id: str,
        *,
        reason: str | None = None,
        by: str | None = None,
        force: bool = False,
        wait: bool = False,
        timeout: float | None = None,
    ) -> JobRecord:
        """Cancel a job that is not finished without cutting off a tool call in flight (see
        :mod:`affidavit.runtime._cancel`): a job with no open invocation is cancelled at once;
        otherwise a cancel request is recorded, the call's real outcome is recorded when it is
        known, and the job ends cancelled then. When the worker holding the job died with the
        call in flight (its lease expired), this runtime resolves it at once if it has the
        job's tools — the tool's ``reconcile`` hook, else the in-flight policy (a park, or
        ``fail``) — as any recovery would. ``force``: cancel now, closing open invocations as
        ``unknown`` (never ``lost``). ``wait``: return once the job has ended or parked, for
        up to ``timeout`` seconds. The job as it is then.

        Raises:
            JobNotFound: no such job.
            InvalidStateError: the job already completed, failed or was cancelled.
            WaitTimeout: ``wait`` and the job still runs after ``timeout`` seconds.
        """
        self._check_open()
        done = request_cancel(
            self.store, job_id, reason=reason, by=by, force=force, sealer=self.sealer
        )
        if done.waiting_on == "recovery":
            self.worker.run_once(job_id)  # (a job this runtime lacks the tools of: handed back)
        if wait and done.state == "requested":
            return self.wait(job_id, timeout=timeout)
        return self.store.get_job(job_id)

    def resume(
        self,
        job_id: str,
        decision: str,
        *,
        result: Any = None,
        by: str | None = None,
        note: str | None = None,
        park_version: int | None = None,
        budget: Any = None,
    ) -> JobRecord:
        """Resolve a parked job: ``retry`` / ``accept_result`` / ``fail`` for an in-flight
        invocation, ``continue`` / ``fail`` after a confirmation mismatch, ``retry`` / ``fail``
        for a crash loop, ``continue`` with a new ``budget`` (absolute) / ``fail`` for a call
        that would have exceeded the job's budget. With ``park_version`` (the version of the
        ``job_parked`` event the decision is about), a job parked again since is refused with
        :class:`~affidavit.runtime._decisions.InvalidStateError` and nothing is written. See
        :func:`~affidavit.runtime._decisions.resume_job`."""
        self._check_open()
        return resume_job(
            self.store,
            job_id,
            decision,
            result=result,
            by=by,
            note=note,
            sealer=self.sealer,
            park_version=park_version,
            budget=budget,
        )
