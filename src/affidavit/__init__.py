"""affidavit: run AI-agent jobs with at-most-once side effects, crash recovery and a
tamper-evident record anyone can verify offline.

The public API is what this module exports (``__all__``); everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from affidavit.core.errors import (
    AffidavitError,
    AgentNotFound,
    AuthorizationError,
    CanonicalizationError,
    ClaimRejected,
    CommandNotAllowed,
    ConfigError,
    ConflictError,
    FencedError,
    JobNotFound,
    PlanError,
    ReplayError,
    SignalPayloadError,
    SignalRejected,
    StoreError,
    StoreUnavailable,
    StreamError,
    ValidationError,
    VerificationError,
    WaitTimeout,
)
from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.claims import (
        Agent,
        ClaimService,
        ClaimType,
        ClaimVerdict,
        SandboxConfig,
        TrustPolicy,
    )
    from affidavit.client import AsyncClient, Client
    from affidavit.core.budget import Budget
    from affidavit.core.canonical import canonical, canonical_sha256, sha256_hex, sha256_prefixed
    from affidavit.core.chain import chain_root, check_stored_chain, execution_hash
    from affidavit.core.events import EventType
    from affidavit.core.plan import Plan
    from affidavit.core.seal import PublicKey, Seal
    from affidavit.core.signing import SigningKey
    from affidavit.core.streams import StreamLimit
    from affidavit.record._replay import ReplayContext, ReplayContextBuilder
    from affidavit.runtime._agent import AgentContext, agent
    from affidavit.runtime._children import ChildResult
    from affidavit.runtime._confirm import Confirmation, ConfirmationContext, ResourceVerifier
    from affidavit.runtime._limits import Limit
    from affidavit.runtime._mcp_hooks import mcp_reconcile
    from affidavit.runtime._queues import queue
    from affidavit.runtime._runtime import Runtime
    from affidavit.runtime._sdk import (
        CompensatableError,
        RetryableError,
        StateChange,
        Tool,
        ToolCallError,
        ToolCancelled,
        ToolContext,
        ToolRegistry,
        load_tools,
        pure,
        register_verifier,
        tool,
    )
    from affidavit.runtime._verifiers import FileVerifier, HttpVerifier, SqlRowVerifier, record_file
    from affidavit.store import JobFilter, JobRecord, NewEvent, Store, StoredEvent, open_store
    from affidavit.verify import verify_events, verify_job

__version__ = "0.1.0"

# Every name but the errors is imported on first use: a program pays at start-up only for the
# layers it uses (`affidavit --version` for none; a worker not for claims or verification).
_LAZY = (
    {
        name: "affidavit.claims"
        for name in (
            "Agent",
            "ClaimService",
            "ClaimType",
            "SandboxConfig",
            "TrustPolicy",
            "ClaimVerdict",
        )
    }
    | {"verify_events": "affidavit.verify", "verify_job": "affidavit.verify"}
    | {
        "AgentContext": "affidavit.runtime._agent",
        "AsyncClient": "affidavit.client",
        "ChildResult": "affidavit.runtime._children",
        "Budget": "affidavit.core.budget",
        "Client": "affidavit.client",
        "CompensatableError": "affidavit.runtime._sdk",
        "Confirmation": "affidavit.runtime._confirm",
        "ConfirmationContext": "affidavit.runtime._confirm",
        "EventType": "affidavit.core.events",
        "FileVerifier": "affidavit.runtime._verifiers",
        "HttpVerifier": "affidavit.runtime._verifiers",
        "JobFilter": "affidavit.store",
        "JobRecord": "affidavit.store",
        "Limit": "affidavit.runtime._limits",
        "NewEvent": "affidavit.store",
        "Plan": "affidavit.core.plan",
        "PublicKey": "affidavit.core.seal",
        "ReplayContext": "affidavit.record._replay",
        "ReplayContextBuilder": "affidavit.record._replay",
        "ResourceVerifier": "affidavit.runtime._confirm",
        "RetryableError": "affidavit.runtime._sdk",
        "Runtime": "affidavit.runtime._runtime",
        "Seal": "affidavit.core.seal",
        "SigningKey": "affidavit.core.signing",
        "SqlRowVerifier": "affidavit.runtime._verifiers",
        "StateChange": "affidavit.runtime._sdk",
        "Store": "affidavit.store",
        "StoredEvent": "affidavit.store",
        "StreamLimit": "affidavit.core.streams",
        "Tool": "affidavit.runtime._sdk",
        "ToolCallError": "affidavit.runtime._sdk",
        "ToolCancelled": "affidavit.runtime._sdk",
        "ToolContext": "affidavit.runtime._sdk",
        "ToolRegistry": "affidavit.runtime._sdk",
        "agent": "affidavit.runtime._agent",
        "canonical": "affidavit.core.canonical",
        "canonical_sha256": "affidavit.core.canonical",
        "chain_root": "affidavit.core.chain",
        "check_stored_chain": "affidavit.core.chain",
        "execution_hash": "affidavit.core.chain",
        "load_tools": "affidavit.runtime._sdk",
        "mcp_reconcile": "affidavit.runtime._mcp_hooks",
        "open_store": "affidavit.store",
        "pure": "affidavit.runtime._sdk",
        "queue": "affidavit.runtime._queues",
        "record_file": "affidavit.runtime._verifiers",
        "register_verifier": "affidavit.runtime._sdk",
        "sha256_hex": "affidavit.core.canonical",
        "sha256_prefixed": "affidavit.core.canonical",
        "tool": "affidavit.runtime._sdk",
    }
)


_lazy = lazy_exports("affidavit", _LAZY, globals())


def __getattr__(name: str) -> Any:
    # ``affidavit.VerificationResult``: the claims verdict's old name, kept for one release
    if name == "VerificationResult":
        from affidavit.claims import deprecated_name

        return deprecated_name("affidavit", name)
    return _lazy(name)


__all__ = [
    "AffidavitError",
    "Agent",
    "AgentContext",
    "AgentNotFound",
    "AsyncClient",
    "AuthorizationError",
    "Budget",
    "CanonicalizationError",
    "ChildResult",
    "ClaimRejected",
    "ClaimService",
    "ClaimType",
    "ClaimVerdict",
    "Client",
    "CommandNotAllowed",
    "CompensatableError",
    "ConfigError",
    "Confirmation",
    "ConfirmationContext",
    "ConflictError",
    "EventType",
    "FencedError",
    "FileVerifier",
    "HttpVerifier",
    "JobFilter",
    "JobNotFound",
    "JobRecord",
    "Limit",
    "NewEvent",
    "Plan",
    "PlanError",
    "PublicKey",
    "ReplayContext",
    "ReplayContextBuilder",
    "ReplayError",
    "ResourceVerifier",
    "RetryableError",
    "Runtime",
    "SandboxConfig",
    "Seal",
    "SignalPayloadError",
    "SignalRejected",
    "SigningKey",
    "SqlRowVerifier",
    "StateChange",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredEvent",
    "StreamError",
    "StreamLimit",
    "Tool",
    "ToolCallError",
    "ToolCancelled",
    "ToolContext",
    "ToolRegistry",
    "TrustPolicy",
    "ValidationError",
    "VerificationError",
    "WaitTimeout",
    "__version__",
    "agent",
    "canonical",
    "canonical_sha256",
    "chain_root",
    "check_stored_chain",
    "execution_hash",
    "load_tools",
    "mcp_reconcile",
    "open_store",
    "pure",
    "queue",
    "record_file",
    "register_verifier",
    "sha256_hex",
    "sha256_prefixed",
    "tool",
    "verify_events",
    "verify_job",
]
