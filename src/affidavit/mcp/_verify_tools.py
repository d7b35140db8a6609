"""The verification tools of ``affidavit mcp``: ``verify_job``, ``export_pack``,
``verify_pack``, ``verify_claim``, ``get_trust``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import tempfile
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from pydantic import Field

from affidavit.claims import ClaimService, SandboxConfig
from affidavit.claims.model import ClaimType
from affidavit.core.errors import AffidavitError, ValidationError
from affidavit.faces.limits import ClaimSlots
from affidavit.mcp import _schemas as S
from affidavit.mcp._calls import Calls, make_tool, tool_error
from affidavit.packs import (
    ArchiveLimits,
    PackArchiveError,
    export_archive,
    read_pack_archive,
    verify_pack,
    write_members,
)
from affidavit.store import Store
from affidavit.verify import verify_job

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024  # a pack archive sent or returned, compressed
MAX_EXTRACTED_BYTES = 512 * 1024 * 1024  # what an archive sent to verify_pack may unpack to
MAX_MEMBERS = 100_000
JobId = Annotated[str, Field(min_length=1, max_length=200)]
AgentId = Annotated[str, Field(min_length=1, max_length=128)]


def _decode(archive_base64: str) -> bytes:
    if len(archive_base64) > (MAX_ARCHIVE_BYTES * 4) // 3 + 4:
        raise PackArchiveError(f"pack archive is larger than {MAX_ARCHIVE_BYTES} bytes")
    try:
        return base64.b64decode(archive_base64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PackArchiveError(f"archive_base64 is not base64: {exc}") from exc


def verify_tools(
    store: Store, calls: Calls, slots: ClaimSlots, claims_sandbox: SandboxConfig | None
) -> list[Tool]:
    return [
        _verify_job(store, calls),
        _export_pack(store, calls),
        _verify_pack(calls),
        _verify_claim(store, calls, slots, claims_sandbox),
        _get_trust(store, calls),
    ]


def _verify_job(store: Store, calls: Calls) -> Tool:
    async def verify_job_tool(
        job_id: JobId,
        ctx: Context,
        trusted_keys: Annotated[
            list[str] | None,
            Field(
                description="Pin the seal's keys: base64 Ed25519 public keys or key ids.",
                max_length=32,
            ),
        ] = None,
    ) -> S.JobVerification:
        def work() -> Any:
            caller = calls.caller(ctx, "observer")
            calls.visible_job(caller, job_id)
            return verify_job(store, job_id, trusted_keys=trusted_keys or None).to_dict()

        return await calls.run(work)

    return make_tool(
        verify_job_tool,
        "verify_job",
        "Verification Mode for one job (read-only): execution hash, event chain root, ledger "
        "and replay proofs, stored chain, seal. `ok` is the verdict. Role: observer.",
        read_only=True,
        idempotent=True,
    )


def _export_pack(store: Store, calls: Calls) -> Tool:
    async def export_pack_tool(job_id: JobId, ctx: Context) -> S.ExportedPack:
        def work() -> Any:
            caller = calls.caller(ctx, "observer")
            calls.visible_job(caller, job_id)
            data, result = export_archive(store, job_id)
            if len(data) > MAX_ARCHIVE_BYTES:
                raise ValidationError(
                    f"the pack of job {job_id} is {len(data)} bytes, more than an MCP answer "
                    f"carries here ({MAX_ARCHIVE_BYTES})",
                    hint="Download it with GET /api/jobs/{id}/pack or `affidavit pack export`.",
                )
            return {
                "job_id": job_id,
                "filename": f"pack-{job_id}.tar.gz",
                "archive_sha256": hashlib.sha256(data).hexdigest(),
                "archive_bytes": len(data),
                "pack_root_sha256": result.pack_root_sha256,
                "assay_diverging_steps": list(result.assay_diverging_steps),
                "archive_base64": base64.b64encode(data).decode("ascii"),
            }

        return await calls.run(work)

    return make_tool(
        export_pack_tool,
        "export_pack",
        "The finished job as a signed RCE v0.1 proof pack: a base64 .tar.gz (verify it "
        "offline with `affidavit pack verify` or the verify_pack tool). Role: observer.",
        read_only=True,
        idempotent=True,
    )


def _verify_pack(calls: Calls) -> Tool:
    limits = ArchiveLimits(max_members=MAX_MEMBERS, max_total_bytes=MAX_EXTRACTED_BYTES)

    async def verify_pack_tool(
        archive_base64: Annotated[str, Field(min_length=1)],
        ctx: Context,
        trusted_keys: Annotated[
            list[str] | None,
            Field(description="Pin the signers: base64 Ed25519 public keys.", max_length=32),
        ] = None,
    ) -> S.PackVerification:
        def work() -> Any:
            calls.caller(ctx, "observer")
            archive = read_pack_archive(_decode(archive_base64), limits)
            with tempfile.TemporaryDirectory(prefix="affidavit-mcp-pack-") as tmp:
                verdict = verify_pack(write_members(archive, Path(tmp)), trusted_keys=trusted_keys)
            return {
                "verdict": verdict.verdict,
                "ok": verdict.ok,
                "exit_code": verdict.exit_code,
                "phase": verdict.phase,
                "errors": verdict.errors,
                "receipt": verdict.receipt,
            }

        return await calls.run(work)

    return make_tool(
        verify_pack_tool,
        "verify_pack",
        "Verify a proof pack sent as a base64 .tar.gz (phases 1–5 of the RCE verification); "
        "verdict MATCH, DIVERGE or INTEGRITY_FAIL. A corrupted archive, or one holding links, "
        "absolute paths or '..', is refused (invalid_pack_archive). Role: observer.",
        read_only=True,
        idempotent=True,
    )


def _verify_claim(
    store: Store, calls: Calls, slots: ClaimSlots, claims_sandbox: SandboxConfig | None
) -> Tool:
    async def verify_claim_tool(
        agent_id: Annotated[str, Field(min_length=1, max_length=128, description="The claimant.")],
        claim_type: ClaimType,
        claim: Annotated[
            dict[str, Any],
            Field(
                description="return_code, output_contains, metrics (+ tolerance, parser), "
                "exact_match, pattern_id."
            ),
        ],
        command: Annotated[str, Field(min_length=1, description="The check to run.")],
        ctx: Context,
        timeout_s: Annotated[float | None, Field(gt=0, le=600)] = None,
    ) -> S.ClaimVerdict:
        caller = await calls.run(lambda: calls.caller(ctx, "admin"))
        service = ClaimService(store, sandbox=claims_sandbox)
        cap = slots.limits.max_timeout_s
        if timeout_s is not None and timeout_s > cap:
            raise tool_error(
                ValidationError(
                    f"timeout_s {timeout_s:g} is above this server's limit of {cap:g} seconds",
                    hint="Ask for a shorter timeout.",
                )
            )
        timeout = min(timeout_s if timeout_s is not None else service.sandbox.timeout_s, cap)

        def work() -> Any:
            calls.visible_agent(service, caller, agent_id)
            result = service.verify_claim(
                agent_id, claim_type, claim, command, caller.agent_id, timeout_s=timeout
            )
            return result.to_dict()

        try:  # at most the HTTP API's number of claims at once, in all and per verifier
            return await slots.run(caller.agent_id, work)
        except AffidavitError as exc:
            raise tool_error(exc) from exc

    return make_tool(
        verify_claim_tool,
        "verify_claim",
        "Judge another agent's claim by running its check (allow-listed command, no shell, "
        "sandboxed); the caller's agent is the verifier, the evidence is recorded and the "
        "claimant's trust moves on it. The caller supplies what the claimant claims, so this "
        "is for admin keys only (agents record their own claims over HTTP, POST /api/claims, "
        "and verify each other's by id). Role: admin.",
        read_only=False,
        idempotent=False,
    )


def _get_trust(store: Store, calls: Calls) -> Tool:
    async def get_trust_tool(agent_id: AgentId, ctx: Context) -> S.Trust:
        def work() -> Any:
            caller = calls.caller(ctx, "observer")
            service = ClaimService(store)
            return service.agent_dict(calls.visible_agent(service, caller, agent_id))

        return await calls.run(work)

    return make_tool(
        get_trust_tool,
        "get_trust",
        "An agent's trust score, whether it still requires verification, and its counters. "
        "Role: observer, in the agent's namespace (admins: any).",
        read_only=True,
        idempotent=True,
    )
