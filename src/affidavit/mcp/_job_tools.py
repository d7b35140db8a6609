"""The job tools of ``affidavit mcp``: ``list_jobs``, ``get_job``, ``submit_job``, ``signal``
and ``approve`` — each the HTTP API's route of the same name (docs/api.md), with its role and
namespace checks and the runtime's separation of duties: an approval is decided only by a
principal of role approver or admin who is not the job's submitter (and is among the
approval's ``approvers``), whichever key or tool it comes through."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from pydantic import AwareDatetime, Field

from affidavit.core.errors import ValidationError
from affidavit.faces.auth import Forbidden, check_namespace
from affidavit.faces.limits import DEFAULT_MAX_BODY
from affidavit.mcp import _schemas as S
from affidavit.mcp._calls import Calls, make_tool
from affidavit.record import shown_job
from affidavit.runtime import (
    ToolRegistry,
    registry,
    require_queue,
    signal_job,
    submit_agent_job,
    submit_job,
)
from affidavit.store import JobFilter, Store
from affidavit.store.queues import placement

JobId = Annotated[str, Field(min_length=1, max_length=200)]
Key = Annotated[str, Field(min_length=1, max_length=1000, description="The wait's key.")]
Status = Literal["pending", "running", "waiting", "parked", "completed", "failed", "cancelled"]
MAX_SUBMIT_BYTES = DEFAULT_MAX_BODY  # a plan and its input, as JSON: the HTTP API's body cap


def _bounded(value: Any, what: str) -> None:
    """Over stdio no body cap applies: what an agent sends is bounded here as over HTTP.

    Raises:
        ValidationError: ``value`` is more than ``MAX_SUBMIT_BYTES`` as JSON.
    """
    size = len(json.dumps(value, ensure_ascii=False, default=str).encode())
    if size > MAX_SUBMIT_BYTES:
        raise ValidationError(
            f"{what}: {size} bytes as JSON, more than {MAX_SUBMIT_BYTES}",
            hint="Send less; large data belongs in the tools, not in the job's record.",
        )


def job_tools(store: Store, calls: Calls, tools: ToolRegistry | None = None) -> list[Tool]:
    """The job tools; ``tools``: the registry submitted plans are checked against and agents
    are found in (``None``: plans are checked by the workers that run them, agents are looked
    up in the process's registry)."""
    return [
        _list_jobs(store, calls),
        _get_job(calls),
        _submit_job(store, calls, tools),
        _signal(store, calls),
        _approve(store, calls),
    ]


def _list_jobs(store: Store, calls: Calls) -> Tool:
    async def list_jobs_tool(
        ctx: Context,
        status: Annotated[list[Status] | None, Field(max_length=8)] = None,
        namespace: Annotated[str | None, Field(max_length=64, description="Admins only.")] = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 50,
        before: Annotated[
            str | None,
            Field(max_length=200, description="The `next_before` of the previous page."),
        ] = None,
    ) -> S.JobList:
        def work() -> Any:
            caller = calls.caller(ctx, "observer")
            wanted = check_namespace(namespace) if namespace is not None else None
            if caller.role != "admin":
                if wanted is not None and wanted != caller.namespace:
                    raise Forbidden(f"namespace {wanted!r} is not yours")
                wanted = caller.namespace
            if before is not None:
                calls.visible_job(caller, before)  # another namespace's job: not found
            jobs = store.list_jobs(
                JobFilter(status=status, namespace=wanted, limit=limit, before=before)
            )
            shown = [shown_job(store, j).to_dict() for j in jobs]
            page: dict[str, Any] = {"jobs": shown, "limit": limit}
            if len(jobs) == limit:
                page["next_before"] = jobs[-1].job_id
            return page

        return await calls.run(work)

    return make_tool(
        list_jobs_tool,
        "list_jobs",
        "Jobs of the caller's namespace (an admin's: every namespace, or `namespace`), newest "
        "first; a full page names the cursor of the next (`next_before`). Role: observer.",
        read_only=True,
        idempotent=True,
    )


def _get_job(calls: Calls) -> Tool:
    async def get_job_tool(job_id: JobId, ctx: Context) -> S.Job:
        def work() -> Any:
            job = calls.visible_job(calls.caller(ctx, "observer"), job_id)
            return shown_job(calls.store, job).to_dict()

        return await calls.run(work)

    return make_tool(
        get_job_tool,
        "get_job",
        "One job: its status, output or error, submitter, event count. Another namespace's "
        "job is not found. Role: observer.",
        read_only=True,
        idempotent=True,
    )


def _submit_job(store: Store, calls: Calls, tools: ToolRegistry | None) -> Tool:
    async def submit_job_tool(
        ctx: Context,
        plan: Annotated[
            dict[str, Any] | None, Field(description="The task graph (docs/plans.md).")
        ] = None,
        agent: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=200,
                description="Instead of a plan: the name of an agent registered in the "
                "server (@affidavit.agent in its --tools module); `input` holds its keyword "
                "arguments.",
            ),
        ] = None,
        input: Annotated[Any, Field(description="The job input (JSON).")] = None,
        idempotency_key: Annotated[
            str | None, Field(min_length=1, max_length=200, description="Same key, same job.")
        ] = None,
        namespace: Annotated[str | None, Field(max_length=64, description="Admins only.")] = None,
        queue: Annotated[
            str | None, Field(max_length=128, description="The queue the job waits in.")
        ] = None,
        priority: Annotated[
            int | None, Field(ge=-(2**31), le=2**31 - 1, description="Lower runs first.")
        ] = None,
        partition_key: Annotated[
            str | None, Field(max_length=256, description="One running job per key.")
        ] = None,
        not_before: Annotated[
            AwareDatetime | None,
            Field(description="Not claimed before this time (ISO 8601 with a zone)."),
        ] = None,
    ) -> S.Submitted:
        def work() -> Any:
            caller = calls.caller(ctx, "agent")
            if (plan is None) == (agent is None):
                raise ValidationError(
                    "give exactly one of `plan` and `agent`",
                    hint="A plan is a task graph (docs/plans.md); an agent is the name of one "
                    "registered in the server's --tools module.",
                )
            _bounded([plan, input], "the plan and input")
            where = check_namespace(namespace or caller.namespace)
            if where != caller.namespace and caller.role != "admin":
                raise Forbidden(f"only an admin may submit into namespace {where!r}")
            place = placement(
                queue, priority=priority, partition_key=partition_key, not_before=not_before
            )
            if place is not None:
                require_queue(store, place.queue)
            common: dict[str, Any] = {
                "idempotency_key": idempotency_key,
                "namespace": where,
                "submitted_by": caller.agent_id,
                "placement": place,
            }
            if agent is not None:
                found = tools if tools is not None else registry
                job, created = submit_agent_job(store, agent, input, tools=found, **common)
            else:
                assert plan is not None
                # without --tools, the workers check the plan's tools when they run it
                job, created = submit_job(store, plan, input, tools=tools, **common)
            return {**shown_job(store, job).to_dict(), "created": created}

        return await calls.run(work)

    return make_tool(
        submit_job_tool,
        "submit_job",
        "Validate and enqueue a job — a plan and its input, or a registered agent and its "
        "arguments — in the caller's namespace, submitted by the caller's agent, optionally in "
        "a queue (with a priority, a partition key, a start no earlier than `not_before`); "
        "with an idempotency_key already used there, the existing job (`created: false`). "
        "Nothing is written for an invalid plan, agent, input or queue. Role: agent.",
        read_only=False,
        idempotent=True,  # (by its idempotency_key)
    )


def _signal(store: Store, calls: Calls) -> Tool:
    async def signal_tool(
        job_id: JobId,
        key: Key,
        ctx: Context,
        payload: Annotated[Any, Field(description="The wait node's output (JSON).")] = None,
    ) -> S.Signalled:
        def work() -> Any:
            caller = calls.caller(ctx, "agent")
            calls.visible_job(caller, job_id)
            _bounded(payload, "the payload")
            job, appended = signal_job(
                store,
                job_id,
                key,
                payload,
                by=caller.agent_id,
                principal=caller.principal,
                may_signal=True,
            )
            # a subject's job: its values opened, or erased (as get_job shows them)
            return {**shown_job(store, job).to_dict(), "appended": appended}

        return await calls.run(work)

    return make_tool(
        signal_tool,
        "signal",
        "Complete a job's wait by its correlation key (see the job's trace) with a payload; "
        "repeating a key appends nothing. An approval is decided with `approve`, under its "
        "policy. Role: agent.",
        read_only=False,
        idempotent=True,
    )


def _approve(store: Store, calls: Calls) -> Tool:
    async def approve_tool(
        job_id: JobId,
        key: Key,
        approved: bool,
        ctx: Context,
        comment: Annotated[str | None, Field(max_length=2000)] = None,
    ) -> S.Signalled:
        def work() -> Any:
            caller = calls.caller(ctx, "approver")
            calls.visible_job(caller, job_id)
            decision: dict[str, Any] = {"approved": approved}
            if comment is not None:
                decision["comment"] = comment
            job, appended = signal_job(
                store,
                job_id,
                key,
                decision,
                by=caller.agent_id,
                principal=caller.principal,
                may_signal=False,
            )
            # a subject's job: its values opened, or erased (as get_job shows them)
            return {**shown_job(store, job).to_dict(), "appended": appended}

        return await calls.run(work)

    return make_tool(
        approve_tool,
        "approve",
        "Decide a job's approval (approved true or false, with an optional comment). Never "
        "by the job's submitter; only by a principal the approval's `approvers` allow; a "
        "principal deciding again appends nothing. A rejection fails the job. Role: approver "
        "or admin.",
        read_only=False,
        destructive=True,
        idempotent=True,
    )
