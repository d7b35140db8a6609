"""The :class:`Runtime`: submit jobs, run them, and the human decisions on them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.config import DEFAULT_NAMESPACE, database_url
from affidavit.core.errors import ConfigError, PlanError
from affidavit.core.events import utc_now
from affidavit.core.plan import Plan
from affidavit.runtime.confirm import REPLAY_VERIFICATION_MODES, ResourceVerifier
from affidavit.runtime.decisions import (
    RESUME_DECISIONS,
    InvalidStateError,
    cancel_job,
    resume_job,
    signal_job,
)
from affidavit.runtime.metrics import RuntimeMetrics
from affidavit.runtime.sdk import Tool, ToolRegistry, registry
from affidavit.runtime.worker import DEFAULT_LEASE_SECONDS, Worker
from affidavit.store import JobRecord, NewEvent, Store, open_store

__all__ = ["RESUME_DECISIONS", "InvalidStateError", "Runtime"]


class Runtime:
    """One database and one tool registry.

    ``Runtime("sqlite:///./affidavit.db", tools=[...], verifiers=[...])``; ``tools`` defaults
    to every tool (and resource verifier) registered in the module-level registry;
    ``verifiers`` adds resource verifiers for confirmation replay.
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        store: Store | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        verifiers: Iterable[ResourceVerifier] = (),
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
        self.worker = Worker(
            self.store,
            self.tools,
            lease_seconds=lease_seconds,
            worker_id=worker_id,
            metrics=self.metrics,
        )

    def close(self) -> None:
        self.store.close()

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
        for node in plan.nodes:
            if node.type not in ("tool", "pure"):
                continue
            found = self.tools.get(node.tool or "")
            if found is None:
                known = ", ".join(self.tools.names()) or "none"
                raise PlanError(
                    f"node {node.id!r} uses {node.type} {node.tool!r}, which is not registered",
                    node_id=node.id,
                    hint=f"Registered: {known}. Load the module that defines it with --tools.",
                )
            if found.kind != node.type:
                raise PlanError(
                    f"node {node.id!r} is a {node.type} node but {node.tool!r} is registered "
                    f"with @{found.kind}",
                    node_id=node.id,
                )

    def submit(
        self,
        plan: Plan | Mapping[str, Any] | str | Path,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        submitted_by: str | None = None,
        replay_verification: str | None = None,
    ) -> JobRecord:
        """Validate and enqueue a job; the same ``idempotency_key`` returns the same job.
        Nothing is written unless the plan, its tools and the input are all valid.

        ``replay_verification`` (``strict`` | ``warn`` | ``human``) overrides the plan's mode
        for this job; the effective policy is recorded in ``plan_generated``.

        Raises:
            PlanError: the plan is invalid or uses a tool that is not registered.
            ConfigError: an unknown ``replay_verification`` mode.
            CanonicalizationError: the input is not JSON that can be recorded.
        """
        if isinstance(plan, Plan):
            parsed = plan
        elif isinstance(plan, Mapping):
            parsed = Plan.parse(dict(plan))
        else:
            parsed = Plan.from_file(plan)
        self.check_plan(parsed)
        policy = parsed.policy.to_dict()
        if replay_verification is not None:
            if replay_verification not in REPLAY_VERIFICATION_MODES:
                raise ConfigError(
                    f"unknown replay_verification mode {replay_verification!r}",
                    hint=f"Use one of: {', '.join(REPLAY_VERIFICATION_MODES)}.",
                )
            policy["replay_verification"] = replay_verification
        job_input = {} if input is None else input
        canonical(job_input)  # rejects non-JSON input with its path, before anything is written
        at = utc_now()
        job, _ = self.store.create_job(
            namespace=namespace,
            plan_name=parsed.name,
            idempotency_key=idempotency_key,
            submitted_by=submitted_by,
            events=[
                NewEvent(
                    "job_created",
                    {
                        "at": at,
                        "input": job_input,
                        "plan_name": parsed.name,
                        "namespace": namespace,
                        "submitted_by": submitted_by,
                        "idempotency_key": idempotency_key,
                    },
                ),
                NewEvent(
                    "plan_generated",
                    {
                        "at": at,
                        "task_graph": dict(parsed.task_graph),
                        "plan_hash": parsed.plan_hash,
                        "policy": policy,
                    },
                ),
            ],
        )
        return job

    # --- run ----------------------------------------------------------------------------------

    def run_until_idle(self, *, concurrency: int = 1) -> int:
        """Run runnable jobs until none is left; return how many runs were made."""
        before = self.worker.jobs_run
        self.worker.run(until_idle=True, concurrency=concurrency)
        return self.worker.jobs_run - before

    def run_job(self, job_id: str) -> JobRecord:
        """Run one job in this process until it completes, fails, waits or parks (a job that
        is not runnable — finished, or leased by a live worker — is returned as it is)."""
        self.worker.run_once(job_id)
        return self.store.get_job(job_id)

    def get_job(self, job_id: str) -> JobRecord:
        return self.store.get_job(job_id)

    # --- human decisions (the service functions of :mod:`affidavit.runtime.decisions`) ---------

    def signal(
        self, job_id: str, key: str, payload: Any = None, *, by: str | None = None
    ) -> JobRecord:
        """Complete the wait whose correlation key is ``key`` with ``payload``; the job becomes
        runnable. A repeated signal returns the job and writes nothing. See
        :func:`~affidavit.runtime.decisions.signal_job`."""
        job, _ = signal_job(self.store, job_id, key, payload, by=by)
        return job

    def cancel(self, job_id: str, *, reason: str | None = None, by: str | None = None) -> JobRecord:
        """Cancel a job that is not finished; open invocations are closed as ``lost``. See
        :func:`~affidavit.runtime.decisions.cancel_job`."""
        return cancel_job(self.store, job_id, reason=reason, by=by)

    def resume(
        self,
        job_id: str,
        decision: str,
        *,
        result: Any = None,
        by: str | None = None,
        note: str | None = None,
    ) -> JobRecord:
        """Resolve a parked job: ``retry`` / ``accept_result`` / ``fail`` for an in-flight
        invocation, ``continue`` / ``fail`` after a confirmation mismatch. See
        :func:`~affidavit.runtime.decisions.resume_job`."""
        return resume_job(self.store, job_id, decision, result=result, by=by, note=note)
