"""Runtime: plan and agent execution, workers, the invocation ledger, recovery, human decisions
(docs/runtime.md).

The names below are what the engine offers: the tools and agent SDK, running and submitting
jobs, workers, and deciding, signalling and cancelling them. The job's record it writes (the
replay context, traces, seals, decision context) is read through :mod:`affidavit.record`. The
modules behind these names are internal and may change. Each name is imported on first use, so
that importing one part of the runtime (the tools SDK) does not load the rest. (The ``@agent``
decorator is ``affidavit.agent``: here that name is the module defining it.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.runtime._agent import Agent, AgentContext, agent
    from affidavit.runtime._cancel import CancelResult, erasure_cancel, request_cancel
    from affidavit.runtime._confirm import Confirmation, ConfirmationContext, ResourceVerifier
    from affidavit.runtime._decisions import InvalidStateError, cancel_job, resume_job, signal_job
    from affidavit.runtime._fork import fork_job, submit_fork
    from affidavit.runtime._queues import require_queue, write_declared
    from affidavit.runtime._run_base import DEFAULT_MAX_RECOVERIES, DEFAULT_STORE_RETRY_SECONDS
    from affidavit.runtime._runtime import Runtime
    from affidavit.runtime._schedule_slots import MAX_CATCH_UP
    from affidavit.runtime._scheduler import Scheduler, background_scheduler
    from affidavit.runtime._schedules import (
        ScheduleNotFound,
        add_schedule,
        check_timing,
        delete_schedule,
        get_schedule,
        list_runs,
        list_schedules,
        prepare_schedule,
        schedule_doc,
        set_paused,
        store_schedule,
    )
    from affidavit.runtime._sdk import (
        CompensatableError,
        RetryableError,
        StateChange,
        Tool,
        ToolCallError,
        ToolContext,
        ToolRegistry,
        load_tools,
        pure,
        register_verifier,
        registry,
        tool,
    )
    from affidavit.runtime._submit import (
        check_agent_input,
        check_idempotency_key,
        check_plan,
        resolve_agent,
        submit_agent_job,
        submit_job,
        valid_traceparent,
    )
    from affidavit.runtime._verifiers import (
        FileVerifier,
        HttpVerifier,
        SqlRowVerifier,
        record_file,
    )
    from affidavit.runtime._waiting import SETTLED_STATUSES, wait_for_job
    from affidavit.runtime._worker import (
        DEFAULT_LEASE_SECONDS,
        Worker,
        allowed_clock_offset,
        clock_problem,
        open_store_waiting,
    )

_LAZY = {
    "Agent": "affidavit.runtime._agent",
    "AgentContext": "affidavit.runtime._agent",
    "agent": "affidavit.runtime._agent",
    "Confirmation": "affidavit.runtime._confirm",
    "ConfirmationContext": "affidavit.runtime._confirm",
    "ResourceVerifier": "affidavit.runtime._confirm",
    "CancelResult": "affidavit.runtime._cancel",
    "request_cancel": "affidavit.runtime._cancel",
    "erasure_cancel": "affidavit.runtime._cancel",
    "fork_job": "affidavit.runtime._fork",
    "submit_fork": "affidavit.runtime._fork",
    "InvalidStateError": "affidavit.runtime._decisions",
    "cancel_job": "affidavit.runtime._decisions",
    "resume_job": "affidavit.runtime._decisions",
    "signal_job": "affidavit.runtime._decisions",
    "DEFAULT_MAX_RECOVERIES": "affidavit.runtime._run_base",
    "DEFAULT_STORE_RETRY_SECONDS": "affidavit.runtime._run_base",
    "Runtime": "affidavit.runtime._runtime",
    "MAX_CATCH_UP": "affidavit.runtime._schedule_slots",
    "Scheduler": "affidavit.runtime._scheduler",
    "background_scheduler": "affidavit.runtime._scheduler",
    "ScheduleNotFound": "affidavit.runtime._schedules",
    "add_schedule": "affidavit.runtime._schedules",
    "check_timing": "affidavit.runtime._schedules",
    "delete_schedule": "affidavit.runtime._schedules",
    "get_schedule": "affidavit.runtime._schedules",
    "list_runs": "affidavit.runtime._schedules",
    "list_schedules": "affidavit.runtime._schedules",
    "prepare_schedule": "affidavit.runtime._schedules",
    "store_schedule": "affidavit.runtime._schedules",
    "schedule_doc": "affidavit.runtime._schedules",
    "set_paused": "affidavit.runtime._schedules",
    "CompensatableError": "affidavit.runtime._sdk",
    "RetryableError": "affidavit.runtime._sdk",
    "StateChange": "affidavit.runtime._sdk",
    "Tool": "affidavit.runtime._sdk",
    "ToolCallError": "affidavit.runtime._sdk",
    "ToolContext": "affidavit.runtime._sdk",
    "ToolRegistry": "affidavit.runtime._sdk",
    "load_tools": "affidavit.runtime._sdk",
    "pure": "affidavit.runtime._sdk",
    "register_verifier": "affidavit.runtime._sdk",
    "registry": "affidavit.runtime._sdk",
    "tool": "affidavit.runtime._sdk",
    "require_queue": "affidavit.runtime._queues",
    "write_declared": "affidavit.runtime._queues",
    "check_agent_input": "affidavit.runtime._submit",
    "check_idempotency_key": "affidavit.runtime._submit",
    "check_plan": "affidavit.runtime._submit",
    "resolve_agent": "affidavit.runtime._submit",
    "submit_agent_job": "affidavit.runtime._submit",
    "submit_job": "affidavit.runtime._submit",
    "valid_traceparent": "affidavit.runtime._submit",
    "FileVerifier": "affidavit.runtime._verifiers",
    "HttpVerifier": "affidavit.runtime._verifiers",
    "SqlRowVerifier": "affidavit.runtime._verifiers",
    "record_file": "affidavit.runtime._verifiers",
    "SETTLED_STATUSES": "affidavit.runtime._waiting",
    "wait_for_job": "affidavit.runtime._waiting",
    "DEFAULT_LEASE_SECONDS": "affidavit.runtime._worker",
    "Worker": "affidavit.runtime._worker",
    "allowed_clock_offset": "affidavit.runtime._worker",
    "clock_problem": "affidavit.runtime._worker",
    "open_store_waiting": "affidavit.runtime._worker",
}

__getattr__ = lazy_exports("affidavit.runtime", _LAZY, globals())

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_RECOVERIES",
    "DEFAULT_STORE_RETRY_SECONDS",
    "MAX_CATCH_UP",
    "SETTLED_STATUSES",
    "Agent",
    "AgentContext",
    "CancelResult",
    "CompensatableError",
    "Confirmation",
    "ConfirmationContext",
    "FileVerifier",
    "HttpVerifier",
    "InvalidStateError",
    "ResourceVerifier",
    "RetryableError",
    "Runtime",
    "ScheduleNotFound",
    "Scheduler",
    "SqlRowVerifier",
    "StateChange",
    "Tool",
    "ToolCallError",
    "ToolContext",
    "ToolRegistry",
    "Worker",
    "add_schedule",
    "agent",
    "allowed_clock_offset",
    "background_scheduler",
    "cancel_job",
    "check_agent_input",
    "check_idempotency_key",
    "check_plan",
    "check_timing",
    "clock_problem",
    "delete_schedule",
    "erasure_cancel",
    "fork_job",
    "get_schedule",
    "list_runs",
    "list_schedules",
    "load_tools",
    "open_store_waiting",
    "prepare_schedule",
    "pure",
    "record_file",
    "register_verifier",
    "registry",
    "request_cancel",
    "require_queue",
    "resolve_agent",
    "resume_job",
    "schedule_doc",
    "set_paused",
    "signal_job",
    "store_schedule",
    "submit_agent_job",
    "submit_fork",
    "submit_job",
    "tool",
    "valid_traceparent",
    "wait_for_job",
    "write_declared",
]
