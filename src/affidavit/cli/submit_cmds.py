"""``affidavit submit``: validate and enqueue a job for workers — and the validation ``run``
shares, done before the database is opened. Enqueueing needs the store and the submission
rules, not the runtime's worker machinery."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened, state
from affidavit.cli.queue_cmds import (
    NotBeforeOption,
    PartitionKeyOption,
    PriorityOption,
    QueueOption,
    parse_not_before,
)
from affidavit.cli.run_options import (
    AgentOption,
    InputOption,
    ReplayVerificationOption,
    ToolsOption,
    lease_seconds,
    parse_json_arg,
)
from affidavit.core.canonical import canonical
from affidavit.core.config import DEFAULT_NAMESPACE
from affidavit.core.errors import ConfigError
from affidavit.core.plan import Plan
from affidavit.core.tags import parse_tags
from affidavit.faces.auth import check_namespace
from affidavit.record import check_input_references
from affidavit.runtime import (
    Agent,
    check_agent_input,
    check_idempotency_key,
    check_plan,
    load_tools,
    registry,
    require_queue,
    resolve_agent,
    submit_agent_job,
    submit_job,
    write_declared,
)
from affidavit.store.queues import placement


def prepared_job(
    plan: Path | None,
    tools: list[str] | None,
    input: str | None,
    lease: float | None = None,
    idempotency_key: str | None = None,
    agent: str | None = None,
) -> tuple[Plan | Agent, Any]:
    """The plan (or the agent, with ``--agent``), checked against the tools, the job input
    and the idempotency key — everything a submission needs, validated before the database is
    opened, so that a refused command creates and writes nothing (not even a new database
    file or schema)."""
    check_idempotency_key(idempotency_key)
    if (plan is None) == (agent is None):
        raise ConfigError(
            "give a plan file or --agent NAME"
            if plan is None
            else "give a plan or --agent, not both",
            hint="`affidavit run plan.yaml --tools mytools` or "
            "`affidavit run --agent NAME --tools mytools`.",
        )
    for spec in tools or []:
        load_tools(spec)
    lease_seconds(lease)
    if agent is not None:
        found = resolve_agent(agent, registry)
        agent_input = parse_json_arg(input, "--input")
        check_agent_input(found, {} if agent_input is None else agent_input)
        return found, agent_input
    assert plan is not None
    parsed = Plan.from_file(plan, max_bytes=state.max_input_bytes)
    check_plan(parsed, registry)
    job_input = parse_json_arg(input, "--input")
    canonical({} if job_input is None else job_input)
    check_input_references(parsed, {} if job_input is None else job_input)
    return parsed, job_input


def submit(
    plan: Annotated[
        Path | None, typer.Argument(help="Plan file (.yaml, .yml or .json); or use --agent.")
    ] = None,
    agent: AgentOption = None,
    tools: ToolsOption = None,
    input: InputOption = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="The same key returns the same job.")
    ] = None,
    replay_verification: ReplayVerificationOption = None,
    queue: QueueOption = None,
    priority: PriorityOption = None,
    partition_key: PartitionKeyOption = None,
    not_before: NotBeforeOption = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            metavar="KEY=VALUE",
            help="Tag the job (repeatable; at most 16): `jobs list --tag` finds it. Tags are "
            "stored in plain text, never encrypted: never put personal data in them.",
        ),
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            help="The person the job's data is about (agent jobs): its values are stored "
            "sealed under the subject's key ($AFFIDAVIT_MASTER_KEY), erasable with "
            "`affidavit erase`.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str,
        typer.Option(
            "--namespace",
            help="The namespace the job belongs to: API keys of that namespace see it (1-64 of "
            "letters, digits, '_', '.', '-').",
        ),
    ] = DEFAULT_NAMESPACE,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate and enqueue a job for workers; nothing runs here.

    Exit codes: 0 enqueued (or already there, with the same idempotency key); 3 invalid plan,
    unknown tool, bad input, invalid namespace or store error (nothing is written).
    """
    with command(as_json):
        tags = parse_tags(tag or ())
        check_namespace(namespace)
        parsed, job_input = prepared_job(
            plan, tools, input, idempotency_key=idempotency_key, agent=agent
        )
        replay = replay_verification.value if replay_verification else None
        where = placement(
            queue,
            priority=priority,
            partition_key=partition_key,
            not_before=parse_not_before(not_before),
        )
        with opened(db) as store:  # (the tools are loaded; no worker is needed to enqueue)
            if where is not None:
                write_declared(store)  # (queues declared in the --tools modules)
                require_queue(store, where.queue)
            if isinstance(parsed, Agent):
                job, _ = submit_agent_job(
                    store,
                    parsed,
                    job_input,
                    tools=registry,
                    idempotency_key=idempotency_key,
                    namespace=namespace,
                    replay_verification=replay,
                    placement=where,
                    tags=tags,
                    subject=subject,
                )
            else:
                job, _ = submit_job(
                    store,
                    parsed,
                    job_input,
                    tools=registry,
                    idempotency_key=idempotency_key,
                    namespace=namespace,
                    replay_verification=replay,
                    placement=where,
                    tags=tags,
                    subject=subject,
                )
    if as_json:
        output.emit_json({"job_id": job.job_id, "status": job.status, "namespace": job.namespace})
    else:
        output.plain(job.job_id)
