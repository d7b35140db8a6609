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
    from affidavit.core.canonical import canonical, canonical_sha256, sha256_hex, sha256_prefixed
    from affidavit.core.chain import chain_root, check_stored_chain, execution_hash
    from affidavit.core.events import EventType
    from affidavit.core.plan import Plan
    from affidavit.core.seal import PublicKey, Seal
    from affidavit.core.signing import SigningKey
    from affidavit.runtime.agent import AgentContext, agent
    from affidavit.runtime.confirm import Confirmation, ConfirmationContext, ResourceVerifier
    from affidavit.runtime.replay import ReplayContext, ReplayContextBuilder
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
    from affidavit.runtime.verifiers import FileVerifier, HttpVerifier, SqlRowVerifier, record_file
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
        "AgentContext": "affidavit.runtime.agent",
        "CompensatableError": "affidavit.runtime.sdk",
        "Confirmation": "affidavit.runtime.confirm",
        "ConfirmationContext": "affidavit.runtime.confirm",
        "EventType": "affidavit.core.events",
        "FileVerifier": "affidavit.runtime.verifiers",
        "HttpVerifier": "affidavit.runtime.verifiers",
        "JobFilter": "affidavit.store",
        "JobRecord": "affidavit.store",
        "NewEvent": "affidavit.store",
        "Plan": "affidavit.core.plan",
        "PublicKey": "affidavit.core.seal",
        "ReplayContext": "affidavit.runtime.replay",
        "ReplayContextBuilder": "affidavit.runtime.replay",
        "ResourceVerifier": "affidavit.runtime.confirm",
        "RetryableError": "affidavit.runtime.sdk",
        "Runtime": "affidavit.runtime.runtime",
        "Seal": "affidavit.core.seal",
        "SigningKey": "affidavit.core.signing",
        "SqlRowVerifier": "affidavit.runtime.verifiers",
        "StateChange": "affidavit.runtime.sdk",
        "Store": "affidavit.store",
        "StoredEvent": "affidavit.store",
        "Tool": "affidavit.runtime.sdk",
        "ToolCallError": "affidavit.runtime.sdk",
        "ToolContext": "affidavit.runtime.sdk",
        "ToolRegistry": "affidavit.runtime.sdk",
        "agent": "affidavit.runtime.agent",
        "canonical": "affidavit.core.canonical",
        "canonical_sha256": "affidavit.core.canonical",
        "chain_root": "affidavit.core.chain",
        "check_stored_chain": "affidavit.core.chain",
        "execution_hash": "affidavit.core.chain",
        "load_tools": "affidavit.runtime.sdk",
        "open_store": "affidavit.store",
        "pure": "affidavit.runtime.sdk",
        "record_file": "affidavit.runtime.verifiers",
        "register_verifier": "affidavit.runtime.sdk",
        "sha256_hex": "affidavit.core.canonical",
        "sha256_prefixed": "affidavit.core.canonical",
        "tool": "affidavit.runtime.sdk",
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
    "AuthorizationError",
    "CanonicalizationError",
    "ClaimRejected",
    "ClaimService",
    "ClaimType",
    "ClaimVerdict",
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
    "Tool",
    "ToolCallError",
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
    "open_store",
    "pure",
    "record_file",
    "register_verifier",
    "sha256_hex",
    "sha256_prefixed",
    "tool",
    "verify_events",
    "verify_job",
]
