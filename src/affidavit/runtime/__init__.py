"""Runtime: plan and agent execution, workers, the invocation ledger, replay, human decisions
(ARCHITECTURE.md).

The names below are the runtime's public surface; the modules behind them are internal and may
change. Each name is imported on first use, so that importing one part of the runtime (a crash
point, the tools SDK) does not load the rest. (The ``@agent`` decorator is ``affidavit.agent``:
here that name is the module defining it.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.runtime._agent import Agent, AgentContext, agent
    from affidavit.runtime._agent_trace import AgentOutcome, agent_trace_of, is_agent_log
    from affidavit.runtime._args import check_input_references
    from affidavit.runtime._cancel import CancelResult, request_cancel
    from affidavit.runtime._confirm import Confirmation, ConfirmationContext, ResourceVerifier
    from affidavit.runtime._crash import crash_point
    from affidavit.runtime._decision_context import decision_context
    from affidavit.runtime._decisions import InvalidStateError, cancel_job, resume_job, signal_job
    from affidavit.runtime._replay import ReplayContext, ReplayContextBuilder, build_from_events
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
    from affidavit.runtime._sealing import (
        Sealer,
        SealKeyRefused,
        SigningKey,
        key_status,
        trust_key,
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
    from affidavit.runtime._trace import NODE_STATE_KINDS, job_trace, park_doc, trace_of
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
    "AgentOutcome": "affidavit.runtime._agent_trace",
    "agent_trace_of": "affidavit.runtime._agent_trace",
    "is_agent_log": "affidavit.runtime._agent_trace",
    "check_input_references": "affidavit.runtime._args",
    "Confirmation": "affidavit.runtime._confirm",
    "ConfirmationContext": "affidavit.runtime._confirm",
    "ResourceVerifier": "affidavit.runtime._confirm",
    "CancelResult": "affidavit.runtime._cancel",
    "request_cancel": "affidavit.runtime._cancel",
    "crash_point": "affidavit.runtime._crash",
    "decision_context": "affidavit.runtime._decision_context",
    "InvalidStateError": "affidavit.runtime._decisions",
    "cancel_job": "affidavit.runtime._decisions",
    "resume_job": "affidavit.runtime._decisions",
    "signal_job": "affidavit.runtime._decisions",
    "ReplayContext": "affidavit.runtime._replay",
    "ReplayContextBuilder": "affidavit.runtime._replay",
    "build_from_events": "affidavit.runtime._replay",
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
    "SealKeyRefused": "affidavit.runtime._sealing",
    "Sealer": "affidavit.runtime._sealing",
    "SigningKey": "affidavit.runtime._sealing",
    "key_status": "affidavit.runtime._sealing",
    "trust_key": "affidavit.runtime._sealing",
    "check_agent_input": "affidavit.runtime._submit",
    "check_idempotency_key": "affidavit.runtime._submit",
    "check_plan": "affidavit.runtime._submit",
    "resolve_agent": "affidavit.runtime._submit",
    "submit_agent_job": "affidavit.runtime._submit",
    "submit_job": "affidavit.runtime._submit",
    "valid_traceparent": "affidavit.runtime._submit",
    "NODE_STATE_KINDS": "affidavit.runtime._trace",
    "job_trace": "affidavit.runtime._trace",
    "park_doc": "affidavit.runtime._trace",
    "trace_of": "affidavit.runtime._trace",
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
    "NODE_STATE_KINDS",
    "SETTLED_STATUSES",
    "Agent",
    "AgentContext",
    "AgentOutcome",
    "CancelResult",
    "CompensatableError",
    "Confirmation",
    "ConfirmationContext",
    "FileVerifier",
    "HttpVerifier",
    "InvalidStateError",
    "ReplayContext",
    "ReplayContextBuilder",
    "ResourceVerifier",
    "RetryableError",
    "Runtime",
    "ScheduleNotFound",
    "Scheduler",
    "SealKeyRefused",
    "Sealer",
    "SigningKey",
    "SqlRowVerifier",
    "StateChange",
    "Tool",
    "ToolCallError",
    "ToolContext",
    "ToolRegistry",
    "Worker",
    "add_schedule",
    "agent",
    "agent_trace_of",
    "allowed_clock_offset",
    "background_scheduler",
    "build_from_events",
    "cancel_job",
    "check_agent_input",
    "check_idempotency_key",
    "check_input_references",
    "check_plan",
    "check_timing",
    "clock_problem",
    "crash_point",
    "decision_context",
    "delete_schedule",
    "get_schedule",
    "is_agent_log",
    "job_trace",
    "key_status",
    "list_runs",
    "list_schedules",
    "load_tools",
    "open_store_waiting",
    "park_doc",
    "prepare_schedule",
    "pure",
    "record_file",
    "register_verifier",
    "registry",
    "request_cancel",
    "resolve_agent",
    "resume_job",
    "schedule_doc",
    "set_paused",
    "signal_job",
    "store_schedule",
    "submit_agent_job",
    "submit_job",
    "tool",
    "trace_of",
    "trust_key",
    "valid_traceparent",
    "wait_for_job",
]
