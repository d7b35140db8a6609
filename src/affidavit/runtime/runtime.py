"""The :class:`Runtime`: submit jobs, run them, and the human decisions on them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.config import DEFAULT_NAMESPACE, database_url
from affidavit.core.errors import AffidavitError, JobNotFound, PlanError
from affidavit.core.events import utc_now
from affidavit.core.plan import Plan
from affidavit.runtime.replay import build_from_events
from affidavit.runtime.sdk import Tool, ToolRegistry, registry
from affidavit.runtime.sealing import Sealer, SigningKey
from affidavit.runtime.worker import DEFAULT_LEASE_SECONDS, Worker
from affidavit.store import JobRecord, NewEvent, Store, Transaction, open_store


class InvalidStateError(AffidavitError):
    code = "invalid_state"
    default_hint = "Check the job's status with `affidavit jobs show JOB`."


RESUME_DECISIONS = ("retry", "accept_result", "fail")


def _locked_job(tx: Transaction, job_id: str) -> JobRecord:
    """The job, locked against concurrent writers for the rest of ``tx``."""
    job = tx.get_job(job_id, for_update=True)
    if job is None:
        raise JobNotFound(job_id)
    return job


class Runtime:
    """One database and one tool registry.

    ``Runtime("sqlite:///./affidavit.db", tools=[...])``; ``tools`` defaults to every tool
    registered by the decorators. ``signing_key`` (a :class:`SigningKey` or a key file path)
    signs the seal of every job that finishes; by default the key file of
    :func:`~affidavit.runtime.sealing.default_key_path`, created on first use.
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        store: Store | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        signing_key: SigningKey | Path | str | None = None,
    ) -> None:
        if tools is None:
            self.tools = registry
        elif isinstance(tools, ToolRegistry):
            self.tools = tools
        else:
            self.tools = ToolRegistry(tools)
        self.store = store if store is not None else open_store(database_url(db_url))
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
            sealer=self.sealer,
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
    ) -> JobRecord:
        """Validate and enqueue a job; the same ``idempotency_key`` returns the same job.
        Nothing is written unless the plan, its tools and the input are all valid."""
        if isinstance(plan, Plan):
            parsed = plan
        elif isinstance(plan, Mapping):
            parsed = Plan.parse(dict(plan))
        else:
            parsed = Plan.from_file(plan)
        self.check_plan(parsed)
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
                        "policy": parsed.policy.to_dict(),
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

    # --- human decisions ----------------------------------------------------------------------

    def cancel(self, job_id: str, *, reason: str | None = None, by: str | None = None) -> JobRecord:
        """Cancel a job that is not finished. Invocations still open are closed as ``lost``
        (the tool may or may not have acted) and the lease is revoked, so a worker still
        running the job can write nothing more.

        Raises:
            InvalidStateError: the job already completed, failed or was cancelled.
        """
        self.sealer.key()  # load or create it before the transaction, not inside
        with self.store.transaction(durable=True) as tx:
            job = _locked_job(tx, job_id)
            if job.terminal:
                raise InvalidStateError(f"job {job_id} is already {job.status}")
            replay = build_from_events(self.store.list_events(job_id))
            at = utc_now()
            events = []
            for key, started in replay.pending_tool_invocations.items():
                events.append(
                    NewEvent(
                        "tool_invocation_finished",
                        {
                            "at": at,
                            "node_id": started["node_id"],
                            "step_id": started["step_id"],
                            "invocation_id": started["invocation_id"],
                            "idempotency_key": key,
                            "outcome": "lost",
                            "catch_up": True,
                            "error": {
                                "type": "cancelled",
                                "message": "job cancelled while in flight",
                            },
                        },
                    )
                )
                tx.ledger_finish(
                    job_id,
                    key,
                    status="failed",
                    error={"type": "cancelled", "message": "job cancelled"},
                )
            events.append(NewEvent("job_cancelled", {"at": at, "reason": reason, "by": by}))
            tx.append(job_id, events, expected_version=job.version)
            tx.set_lease(job_id, attempt_id=None, owner=None, expires_at=None)
            cancelled = tx.update_job(job_id, status="cancelled")
            self.sealer.seal_txn(tx, job_id)
            return cancelled

    def resume(
        self,
        job_id: str,
        decision: str,
        *,
        result: Any = None,
        by: str | None = None,
        note: str | None = None,
    ) -> JobRecord:
        """Resolve a job parked on an in-flight invocation (FORMATS.md §3 closing rule):

        - ``retry``: the invocation is closed as ``lost`` and the tool may run again;
        - ``accept_result``: the invocation is closed as a success with ``result`` (the effect
          happened; a person checked) and the job continues;
        - ``fail``: the invocation is closed as ``lost`` and the job fails.

        Raises:
            InvalidStateError: the job is not parked on an invocation, or the decision is bad.
        """
        if decision not in RESUME_DECISIONS:
            raise InvalidStateError(
                f"unknown decision {decision!r}", hint=f"Use one of: {', '.join(RESUME_DECISIONS)}."
            )
        if decision == "accept_result" and result is None:
            raise InvalidStateError("accept_result needs --result (the effect's result)")
        if result is not None:
            canonical(result)
        self.sealer.key()
        with self.store.transaction(durable=True) as tx:
            job = _locked_job(tx, job_id)
            replay = build_from_events(self.store.list_events(job_id))
            if job.status != "parked" or not replay.pending_tool_invocations:
                raise InvalidStateError(
                    f"job {job_id} is {job.status}, not parked on an in-flight invocation"
                )
            at = utc_now()
            events: list[NewEvent] = []
            for key, started in replay.pending_tool_invocations.items():
                base = {"at": at, "node_id": started["node_id"], "step_id": started["step_id"]}
                closing = {
                    **base,
                    "invocation_id": started["invocation_id"],
                    "idempotency_key": key,
                    "catch_up": True,
                }
                if decision == "accept_result":
                    events += [
                        NewEvent(
                            "tool_invocation_finished",
                            {**closing, "outcome": "success", "result": result},
                        ),
                        NewEvent(
                            "command_committed",
                            {
                                **base,
                                "command_id": started["invocation_id"],
                                "idempotency_key": key,
                                "result_hash": canonical_sha256(result),
                            },
                        ),
                        NewEvent(
                            "node_finished",
                            {
                                **base,
                                "result_type": "side_effect_committed",
                                "attempt": started["attempt"],
                                "duration_ms": 0,
                            },
                        ),
                    ]
                    tx.ledger_finish(job_id, key, status="committed", result=result)
                else:
                    error = {"type": "lost", "message": f"resolved by a person: {decision}"}
                    events.append(
                        NewEvent(
                            "tool_invocation_finished",
                            {**closing, "outcome": "lost", "error": error},
                        )
                    )
                    tx.ledger_finish(job_id, key, status="failed", error=error)
                    if decision == "fail":
                        events.append(
                            NewEvent(
                                "node_finished",
                                {
                                    **base,
                                    "result_type": "permanent_failure",
                                    "error": error,
                                    "attempt": started["attempt"],
                                    "duration_ms": 0,
                                },
                            )
                        )
            events.append(
                NewEvent(
                    "job_resumed",
                    {"at": at, "decision": decision, "result": result, "by": by, "note": note},
                )
            )
            if decision == "fail":
                error = {
                    "type": "in_flight",
                    "message": "invocation in flight or lost; failed by a person",
                }
                events.append(NewEvent("job_failed", {"at": at, "error": error, "node_id": None}))
                tx.append(job_id, events, expected_version=job.version)
                failed = tx.update_job(job_id, status="failed", error=error)
                self.sealer.seal_txn(tx, job_id)
                return failed
            tx.append(job_id, events, expected_version=job.version)
            return tx.update_job(job_id, status="pending")
