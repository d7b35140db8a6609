"""``affidavit agents``, ``affidavit claims`` and ``affidavit trust``: register agents, verify
their claims by running the check, and read the evidence and trust scores.

Exit codes of ``claims verify``: 0 accurate; 1 inaccurate or not judged (timeout, program that
cannot start — see ``decided_by``); 2 agent not found; 3 usage or store error; 5 refused
(allow-list, role, namespace, self-verification, malformed claim) — nothing ran or was written.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from affidavit.claims.bwrap import OPT_OUT_FLAG
from affidavit.claims.model import ClaimType, ClaimVerdict, Role
from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.run_options import parse_json_arg
from affidavit.core.errors import ConfigError, InvalidClaim, ValidationError
from affidavit.core.inputs import InputTooLarge

if TYPE_CHECKING:
    from affidavit.claims import ClaimService, SandboxConfig
    from affidavit.store import Store

agents_app = typer.Typer(help="Register and inspect agents.", no_args_is_help=True)
claims_app = typer.Typer(help="Verify agents' claims and read the evidence.", no_args_is_help=True)
trust_app = typer.Typer(help="Agents' trust scores and trust logs.", no_args_is_help=True)

CLAIM_TYPES = ", ".join(t.value for t in ClaimType)
InsecureOption = Annotated[
    bool,
    typer.Option(
        OPT_OUT_FLAG,
        help="DANGEROUS: run the command without the bubblewrap sandbox (package bubblewrap), "
        "as this user, with its files in reach. Only for a command you trust.",
    ),
]
ROLES = ", ".join(r.value for r in Role)


def _kv_table(doc: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # ids and digests are shown whole
    for key, value in doc.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        table.add_row(f"[bold]{key}[/]", escape(shown))  # (recorded text: never markup)
    return table


def _service(store: Store, sandbox: SandboxConfig | None = None) -> ClaimService:
    """The claim service over ``store`` (imported here: the other commands start without it)."""
    from affidavit.claims.service import ClaimService

    return ClaimService(store) if sandbox is None else ClaimService(store, sandbox=sandbox)


def _score(value: float) -> str:
    return f"{value:.4f}"


# --- agents -----------------------------------------------------------------------------------


@agents_app.command("add")
def add_agent(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    namespace: Annotated[str, typer.Option(help="The agent's namespace.")] = "default",
    role: Annotated[str, typer.Option(help=f"One of: {ROLES}.")] = "agent",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an agent with trust score 0.5.

    Exit codes: 0 added; 3 the id is taken, or a usage or store error; 5 malformed id or role.
    """
    with command(as_json), opened(db) as store:
        svc = _service(store)
        doc = svc.agent_dict(svc.add_agent(agent_id, namespace=namespace, role=role))
    if as_json:
        output.emit_json(doc)
    else:
        output.out.print(f"added agent {agent_id} ({doc['role']}, namespace {doc['namespace']})")


@agents_app.command("list")
def list_agents(
    namespace: Annotated[str | None, typer.Option(help="Only this namespace.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List agents by namespace and id.

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db) as store:
        svc = _service(store)
        docs = [svc.agent_dict(a) for a in svc.list_agents(namespace)]
    if as_json:
        output.emit_json(docs)
        return
    if not docs:
        output.err.print("no agents")
        return
    table = Table("agent_id", "namespace", "role", "trust", "verifications", "accurate", "errors")
    for d in docs:
        table.add_row(
            d["agent_id"],
            d["namespace"],
            d["role"],
            _score(d["trust_score"]),
            str(d["verifications"]),
            str(d["accurate_verifications"]),
            str(d["error_verifications"]),
        )
    output.out.print(table)


@agents_app.command("show")
def show_agent(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one agent.

    Exit codes: 0 shown; 2 no such agent; 3 store error.
    """
    with command(as_json), opened(db) as store:
        svc = _service(store)
        doc = svc.agent_dict(svc.get_agent(agent_id))
    if as_json:
        output.emit_json(doc)
    else:
        output.out.print(_kv_table(doc))


# --- claims -----------------------------------------------------------------------------------


@claims_app.command("make")
def make(
    agent: Annotated[str, typer.Option("--agent", help="The agent making the claim.")],
    claim_type: Annotated[str, typer.Option("--type", help=f"One of: {CLAIM_TYPES}.")],
    claim: Annotated[str, typer.Option("--claim", help="The claim: a JSON object, or @file.json.")],
    cmd: Annotated[
        str, typer.Option("--command", help="The check that proves it (allow-listed, no shell).")
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record an agent's own claim and the command that checks it; print its claim id. Another
    agent verifies it later with `affidavit claims verify --id CLAIM_ID --verifier AGENT`.

    With --json: {"claim_id", "agent_id", "namespace", "claim_type", "claim", "command",
    "created_at"}.

    Exit codes: 0 recorded; 2 agent not found; 3 usage or store error; 5 refused (malformed
    claim, command not allowed: nothing was written).
    """
    with command(as_json):
        try:
            content = parse_json_arg(claim, "--claim")
        except ConfigError as exc:
            raise _claim_error(exc) from None
        with opened(db) as store:
            made = _service(store).make_claim(agent, claim_type, content, cmd)
    if as_json:
        output.emit_json(made.to_dict())
    else:
        output.err.print(f"claim of {made.agent_id} recorded; verify it by id:")
        output.out.print(made.claim_id)


@claims_app.command("verify")
def verify(
    verifier: Annotated[str, typer.Option("--verifier", help="The verifying agent.")],
    claim_id: Annotated[
        str | None, typer.Option("--id", help="A claim its agent recorded (`claims make`).")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Without --id: the agent making the claim.")
    ] = None,
    claim_type: Annotated[
        str | None, typer.Option("--type", help=f"Without --id: one of {CLAIM_TYPES}.")
    ] = None,
    claim: Annotated[
        str | None,
        typer.Option("--claim", help="Without --id: the claim, a JSON object or @file.json."),
    ] = None,
    cmd: Annotated[
        str | None,
        typer.Option("--command", help="Without --id: the check to run (allow-listed, no shell)."),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds before the check is killed.")
    ] = None,
    project_dir: Annotated[
        str | None,
        typer.Option(help="Run in this directory (read-only) instead of a fresh scratch one."),
    ] = None,
    insecure: InsecureOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a claim by running the check in a bubblewrap sandbox; record the evidence and
    move the agent's trust. Either a recorded claim (--id), or one given whole (--agent,
    --type, --claim, --command: the operator's form).

    With --json: {"accurate", "verdict", "decided_by", "claim", "actual", "verification_id",
    "evidence_id", "new_trust_score", "propagation"}.

    Exit codes: 0 accurate; 1 inaccurate or not judged (timeout, spawn error); 2 agent or
    claim not found; 3 usage or store error; 5 refused (nothing ran or was written).
    """
    with command(as_json):
        whole = (agent, claim_type, claim, cmd)
        if (claim_id is None) == (None in whole) or (claim_id is not None and any(whole)):
            raise ConfigError(
                "give --id, or all of --agent, --type, --claim and --command",
                hint="`affidavit claims make` records a claim and prints its id.",
            )
        if timeout is not None and not timeout > 0:
            raise ValidationError(f"--timeout must be positive, not {timeout}")
        from affidavit.claims.sandbox import SandboxConfig

        sandbox = SandboxConfig(project_dir=project_dir, isolation="none" if insecure else "bwrap")
        if claim_id is not None:
            with opened(db) as store:
                svc = _service(store, sandbox)
                agent = svc.get_claim(claim_id).agent_id
                result = svc.verify_made_claim(claim_id, verifier, timeout_s=timeout)
        else:
            assert agent is not None and claim_type is not None and claim is not None
            assert cmd is not None
            try:
                content = parse_json_arg(claim, "--claim")
            except ConfigError as exc:
                raise _claim_error(exc) from None
            with opened(db) as store:
                result = _service(store, sandbox).verify_claim(
                    agent, claim_type, content, cmd, verifier, timeout_s=timeout
                )
    if as_json:
        output.emit_json(result.to_dict())
    else:
        _print_verdict(result, agent)
    if not result.accurate:
        raise typer.Exit(output.EXIT_FAILED)


def _print_verdict(result: ClaimVerdict, agent: str | None) -> None:
    """The verdict, who decided it and ``agent``'s new trust, over a table of the run."""
    style = {"accurate": "green", "inaccurate": "red"}.get(result.verdict, "yellow")
    output.out.print(
        f"[bold {style}]{result.verdict}[/] (decided by {result.decided_by}); "
        f"trust of {agent}: {_score(result.new_trust_score)}"
    )
    output.out.print(
        _kv_table(
            {
                "return_code": result.actual.get("return_code"),
                "duration_ms": result.actual.get("duration_ms"),
                "verification_id": result.verification_id,
                "evidence_id": result.evidence_id,
                "pattern": result.propagation_result["reason"],
            }
        )
    )


@claims_app.command("show")
def show_claim(
    claim_id: Annotated[str, typer.Argument(help="A recorded claim's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """A recorded claim and its verifications: which one moved its agent's trust (a claim
    moves it once), and the re-verifications flagged because they judged it otherwise.

    With --json: the claim's fields, "verifications": [{"verification_id", "verdict",
    "decided_by", "verifier_id", "at", "trust_log_version", "counted", "disagrees"}] and
    "disagreements" (how many are flagged).

    Exit codes: 0 shown; 2 no such claim; 3 store error.
    """
    with command(as_json), opened(db) as store:
        doc = _service(store).claim_view(claim_id)
    if as_json:
        output.emit_json(doc)
        return
    verifications = doc.pop("verifications")
    output.out.print(_kv_table(doc))
    if not verifications:
        output.err.print("not verified yet")
        return
    table = Table("at", "verdict", "decided_by", "verifier", "verification_id", "trust")
    for v in verifications:
        moved = "counted" if v["counted"] else "[bold yellow]DISAGREES[/]" if v["disagrees"] else ""
        fields = ("at", "verdict", "decided_by", "verifier_id", "verification_id")
        table.add_row(*(escape(str(v[k])) for k in fields), moved)
    output.out.print(table)


@claims_app.command("history")
def history(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    claim_type: Annotated[str | None, typer.Option("--type", help="Only this claim type.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 100,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The agent's verification records (the evidence), newest first.

    Exit codes: 0 listed; 1 a stored evidence record was changed outside affidavit
    (record_tampered); 2 no such agent; 3 store error; 5 unknown claim type.
    """
    with command(as_json), opened(db) as store:
        records = _service(store).get_verification_history(agent_id, claim_type, limit)
    if as_json:
        output.emit_json(records)
        return
    if not records:
        output.err.print("no verifications")
        return
    table = Table("verified_at", "type", "verdict", "decided_by", "rc", "command", "verifier")
    for r in records:  # (recorded text — a command may hold "[a-z]" — is never read as markup)
        table.add_row(
            *map(escape, (r["verified_at"], r["claim_type"], r["verdict"], r["decided_by"])),
            "" if r["return_code"] is None else str(r["return_code"]),
            escape(r["command"]),
            escape(r["verifier_id"]),
        )
    output.out.print(table)


@claims_app.command("stats")
def stats(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Totals, accuracy overall and by claim type, and the last 10 verifications.

    Exit codes: 0 shown; 2 no such agent; 3 store error.
    """
    with command(as_json), opened(db) as store:
        doc = _service(store).get_verification_statistics(agent_id)
    if as_json:
        output.emit_json(doc)
        return
    output.out.print(
        f"[bold]{agent_id}[/]: trust {_score(doc['trust_score'])}, "
        f"{doc['accurate_verifications']}/{doc['total_verifications']} accurate "
        f"({doc['accuracy_rate']:.0%}), {doc['error_verifications']} not judged"
    )
    table = Table("claim type", "total", "accurate", "inaccurate", "errors", "accuracy")
    for kind, e in doc["by_claim_type"].items():
        table.add_row(
            kind,
            str(e["total"]),
            str(e["accurate"]),
            str(e["inaccurate"]),
            str(e["errors"]),
            f"{e['accuracy']:.0%}",
        )
    output.out.print(table)
    recent = doc["recent_verifications"]
    if recent:
        last = Table(
            "verified_at",
            "type",
            "verdict",
            "decided_by",
            "verification_id",
            title=f"the last {len(recent)}, newest first (`affidavit claims history` for more)",
            title_justify="left",
        )
        for r in recent:
            fields = ("verified_at", "claim_type", "verdict", "decided_by", "verification_id")
            last.add_row(*(escape(str(r[f])) for f in fields))
        output.out.print(last)


# --- trust ------------------------------------------------------------------------------------


@trust_app.command("show")
def trust_show(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The agent's trust score, its flags, the check of its trust log (chain, seal,
    transparency-log leaves, scores, evidence), and the re-verifications flagged because
    they judged a claim otherwise than the verification that counted.

    With --json: the agent, and "trust_log": {"ok", "entries", "sealed", "seal",
    "problems", "disagreements", ...}.

    Exit codes: 0 shown and the log verifies (flagged re-verifications included); 1 the
    trust log does not verify (or a row of it was changed outside affidavit:
    record_tampered); 2 no such agent; 3 store error.
    """
    with command(as_json), opened(db) as store:
        svc = _service(store)
        doc = {
            **svc.agent_dict(svc.get_agent(agent_id)),
            "trust_log": svc.check_trust_log(agent_id),
        }
    check = doc["trust_log"]
    if as_json:
        output.emit_json(doc)
    else:
        output.out.print(_kv_table({k: v for k, v in doc.items() if k != "trust_log"}))
        render_trust_check(check)
    if not check["ok"]:
        raise typer.Exit(output.EXIT_FAILED)


def render_trust_check(check: dict[str, Any]) -> None:
    """The verdict on a trust log, each problem, and the flagged re-verifications."""
    if check["ok"]:
        seal = check["seal"] or {}
        output.out.print(
            f"[green]trust log verifies[/]: {check['entries']} entries, sealed as "
            f"{escape(str(seal.get('record_id')))} by key {escape(str(seal.get('key_id')))}"
        )
    else:
        output.out.print("[bold red]trust log DOES NOT VERIFY[/]:")
        for problem in check["problems"]:
            output.out.print(f"  - {escape(problem)}")
    flagged = check["disagreements"]
    if flagged:
        table = Table(
            "claim_id",
            "verification_id",
            "verdict",
            "counted verdict",
            title=f"{len(flagged)} re-verification(s) judged a claim otherwise than the one "
            "that counted (they moved nothing)",
            title_justify="left",
        )
        for f in flagged:
            fields = ("claim_id", "verification_id", "verdict", "counted_verdict")
            table.add_row(*(escape(str(f[k])) for k in fields))
        output.out.print(table)


@trust_app.command("history")
def trust_history(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The agent's hash-chained trust log, oldest first.

    With --json: {"agent_id", "entries": [{"version","entry_id","type","payload","chain_hash"}],
    "check": {"ok", "entries", "first_bad_version", "root", "score_matches"}}.

    Exit codes: 0 printed and the log verifies; 1 it does not verify (or a row of it was
    changed outside affidavit: record_tampered); 2 no such agent; 3 store error.
    """
    with command(as_json), opened(db) as store:
        svc = _service(store)
        entries = svc.get_trust_history(agent_id)
        check = svc.check_trust_log(agent_id)
    if as_json:
        output.emit_json(
            {"agent_id": agent_id, "entries": [e.to_dict() for e in entries], "check": check}
        )
    else:
        table = Table("v", "type", "verdict", "before", "after", "pattern", "chain_hash")
        for e in entries:
            p = e.payload
            after = p.get("score_after", p.get("trust_score"))
            before = p.get("score_before")
            table.add_row(
                str(e.version),
                e.type,
                p.get("verdict", ""),
                "" if before is None else _score(before),
                _score(after),
                "applied" if p.get("pattern", {}).get("propagated") else "",
                e.chain_hash[:16] + "…",
            )
        output.out.print(table)
        render_trust_check(check)
        output.out.print(f"root {check['root']}")
    if not check["ok"]:
        raise typer.Exit(output.EXIT_FAILED)


def _claim_error(exc: ConfigError) -> InvalidClaim:
    """A --claim argument that could not be read, as a refused claim; a file over the input
    limit keeps the hint that says how to raise it."""
    return InvalidClaim(exc.message, hint=exc.hint if isinstance(exc, InputTooLarge) else None)
