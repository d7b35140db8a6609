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
    from affidavit.runtime.agent import Agent, AgentContext
    from affidavit.runtime.confirm import Confirmation, ConfirmationContext, ResourceVerifier
    from affidavit.runtime.decisions import (
        InvalidStateError,
        cancel_job,
        resume_job,
        signal_job,
    )
    from affidavit.runtime.replay import ReplayContext, ReplayContextBuilder, build_from_events
    from affidavit.runtime.runtime import Runtime
    from affidavit.runtime.sdk import (
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
        tool,
    )
    from affidavit.runtime.sealing import Sealer
    from affidavit.runtime.trace import trace_of
    from affidavit.runtime.verifiers import FileVerifier, HttpVerifier, SqlRowVerifier, record_file
    from affidavit.runtime.waiting import wait_for_job
    from affidavit.runtime.worker import DEFAULT_LEASE_SECONDS, Worker, open_store_waiting

_LAZY = {
    "Agent": "affidavit.runtime.agent",
    "AgentContext": "affidavit.runtime.agent",
    "Confirmation": "affidavit.runtime.confirm",
    "ConfirmationContext": "affidavit.runtime.confirm",
    "ResourceVerifier": "affidavit.runtime.confirm",
    "InvalidStateError": "affidavit.runtime.decisions",
    "cancel_job": "affidavit.runtime.decisions",
    "resume_job": "affidavit.runtime.decisions",
    "signal_job": "affidavit.runtime.decisions",
    "ReplayContext": "affidavit.runtime.replay",
    "ReplayContextBuilder": "affidavit.runtime.replay",
    "build_from_events": "affidavit.runtime.replay",
    "Runtime": "affidavit.runtime.runtime",
    "CompensatableError": "affidavit.runtime.sdk",
    "RetryableError": "affidavit.runtime.sdk",
    "StateChange": "affidavit.runtime.sdk",
    "Tool": "affidavit.runtime.sdk",
    "ToolCallError": "affidavit.runtime.sdk",
    "ToolContext": "affidavit.runtime.sdk",
    "ToolRegistry": "affidavit.runtime.sdk",
    "load_tools": "affidavit.runtime.sdk",
    "pure": "affidavit.runtime.sdk",
    "register_verifier": "affidavit.runtime.sdk",
    "tool": "affidavit.runtime.sdk",
    "Sealer": "affidavit.runtime.sealing",
    "trace_of": "affidavit.runtime.trace",
    "FileVerifier": "affidavit.runtime.verifiers",
    "HttpVerifier": "affidavit.runtime.verifiers",
    "SqlRowVerifier": "affidavit.runtime.verifiers",
    "record_file": "affidavit.runtime.verifiers",
    "wait_for_job": "affidavit.runtime.waiting",
    "DEFAULT_LEASE_SECONDS": "affidavit.runtime.worker",
    "Worker": "affidavit.runtime.worker",
    "open_store_waiting": "affidavit.runtime.worker",
}

__getattr__ = lazy_exports("affidavit.runtime", _LAZY, globals())

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Agent",
    "AgentContext",
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
    "Sealer",
    "SqlRowVerifier",
    "StateChange",
    "Tool",
    "ToolCallError",
    "ToolContext",
    "ToolRegistry",
    "Worker",
    "build_from_events",
    "cancel_job",
    "load_tools",
    "open_store_waiting",
    "pure",
    "record_file",
    "register_verifier",
    "resume_job",
    "signal_job",
    "tool",
    "trace_of",
    "wait_for_job",
]
