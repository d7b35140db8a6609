"""affidavit: run AI-agent jobs with at-most-once side effects, crash recovery and a
tamper-evident record anyone can verify offline.

The public API is what this module exports (``__all__``); everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.canonical import canonical, canonical_sha256, sha256_hex, sha256_prefixed
from affidavit.core.chain import chain_root, check_stored_chain, execution_hash
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
from affidavit.core.events import EventType
from affidavit.core.lazy import lazy_exports
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

if TYPE_CHECKING:
    from affidavit.claims import (
        Agent,
        ClaimService,
        ClaimType,
        SandboxConfig,
        TrustPolicy,
        VerificationResult,
    )
    from affidavit.verify import verify_events, verify_job

__version__ = "0.1.0"

# Claim verification and Verification Mode are imported on first use: a program that only runs
# jobs (a worker, a short-lived `affidavit run`) does not pay for them at start-up.
_LAZY = {
    name: "affidavit.claims"
    for name in (
        "Agent",
        "ClaimService",
        "ClaimType",
        "SandboxConfig",
        "TrustPolicy",
        "VerificationResult",
    )
} | {"verify_events": "affidavit.verify", "verify_job": "affidavit.verify"}


__getattr__ = lazy_exports("affidavit", _LAZY, globals())


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
    "VerificationResult",
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
