"""``affidavit signal`` and ``affidavit resume``: the human decisions that move a waiting or
parked job on."""

from __future__ import annotations

from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened_for_job
from affidavit.cli.job_view import emit_job, job_doc, show_job, state_user
from affidavit.cli.next_steps import decisions_doc
from affidavit.cli.operator import AsOption, principal_of
from affidavit.cli.run_options import parse_json_arg
from affidavit.core.parks import RESUME_DECISIONS
from affidavit.runtime import resume_job, signal_job


def resume(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    decision: Annotated[
        str, typer.Option(help=f"One of: {', '.join(RESUME_DECISIONS)}.", show_default=False)
    ],
    result: Annotated[
        str | None,
        typer.Option(help="accept_result: the effect's result, JSON or @file.", show_default=False),
    ] = None,
    note: Annotated[str | None, typer.Option(help="Recorded in job_resumed.")] = None,
    by: Annotated[str | None, typer.Option(help="Who decides (recorded).")] = None,
    park: Annotated[
        int | None,
        typer.Option(
            "--park",
            min=1,
            help="Decide only this park: its version, as `jobs show` prints it (parked.version). "
            "A job parked again since, or no longer parked, is refused and nothing is written.",
            show_default=False,
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="continue on a budget_exceeded park: the new budget, JSON (absolute), e.g. "
            "'{\"tool_calls\": 80}'.",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resolve a parked job.

    Parked on an in-flight invocation: retry it, accept_result (a result a person checked), or
    fail. Parked because the world no longer matches a recorded side effect
    (replay_verification: human): continue (accept the world as it is) or fail. Parked as a
    crash loop (crash_loop): retry (once the cause is fixed) or fail. Parked because a call
    would exceed the job's budget (budget_exceeded): continue with --budget JSON (the new
    budget, absolute) or fail. A resumed job is runnable
    again (run a worker). With --park VERSION the decision applies only to the park you looked
    at, not to a later one.

    Exit codes: 0 resolved; 2 no such job; 3 not parked, parked by another park than --park, a
    decision that does not fit, a bad option, or store error.
    """
    with command(as_json):
        value = parse_json_arg(result, "--result")
        new_budget = parse_json_arg(budget, "--budget")
        with opened_for_job(db, job_id) as store:
            job = resume_job(
                store,
                job_id,
                decision,
                result=value,
                by=by or state_user(),
                note=note,
                park_version=park,
                budget=new_budget,
            )
            decisions = None if as_json else decisions_doc(store, job)  # (parked again)
    emit_job(job, as_json, decisions)


def signal(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    key: Annotated[
        str,
        typer.Option(
            "--key", help="The wait's correlation key (see `jobs show`).", show_default=False
        ),
    ],
    payload: Annotated[
        str | None,
        typer.Option(
            help="The wait node's output, JSON or @file. An approval takes exactly "
            '{"approved": true} or {"approved": false} (+ "comment"); false fails the job.',
            show_default=False,
        ),
    ] = None,
    by: Annotated[str | None, typer.Option(help="Who signals (recorded).")] = None,
    as_name: AsOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Complete a wait or approval node of a waiting job; the job becomes runnable (run a
    worker). Re-sending a key that was already signalled changes nothing.

    An approval is decided only with --as NAME: the CLI holds the database, so it decides as
    the operator operator:NAME (role admin), recorded with the decision.

    Exit codes: 0 signalled (or already signalled); 1 the key matches no wait of the job, the
    job has finished, or the approval may not be decided so (no --as, or the submitter); 2 no
    such job; 3 bad payload or store error.
    """
    with command(as_json):
        value = parse_json_arg(payload, "--payload")
        with opened_for_job(db, job_id) as store:
            who = principal_of(as_name)
            job, appended = signal_job(
                store, job_id, key, value, by=by or state_user(), principal=who
            )
            decisions = None if as_json else decisions_doc(store, job)  # (more waits)
    if as_json:
        output.emit_json({**job_doc(job), "appended": appended})
    else:
        if not appended:
            output.err.print(f"key {key!r} was already signalled; nothing changed")
        show_job(job, decisions)
