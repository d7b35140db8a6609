"""``affidavit cancel``: cancel a job without cutting off a tool call in flight (see
:mod:`affidavit.runtime._cancel`)."""

from __future__ import annotations

from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened_for_job
from affidavit.cli.job_view import job_doc, show_job, state_user
from affidavit.record import shown_job
from affidavit.runtime import request_cancel, wait_for_job


def cancel(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    reason: Annotated[str | None, typer.Option(help="Recorded in job_cancelled.")] = None,
    by: Annotated[str | None, typer.Option(help="Who cancels (recorded).")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Cancel now even with a tool call in flight: the call is recorded as unknown "
            "(the tool may or may not have acted).",
        ),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until the job has ended (or parked).")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=0, help="With --wait: give up after this many seconds (exit 3).", show_default=False
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job that has not finished, without cutting off a tool call in flight.

    With no call in flight the job is cancelled at once. Otherwise a cancel request is
    recorded: the call finishes and its real outcome is recorded (a worker that died with it:
    the next worker asks the tool's reconcile hook, else applies the in-flight policy), then the
    job ends cancelled; no new step starts. --force cancels at once and records the call as
    unknown, never as lost.

    Exit codes: 0 cancelled or requested; 2 no such job; 3 already finished, --wait timed out,
    or store error.
    """
    with command(as_json), opened_for_job(db, job_id) as store:
        done = request_cancel(store, job_id, reason=reason, by=by or state_user(), force=force)
        job = done.job
        if not as_json and (done.state == "requested" or done.abandoned):
            output.err.print(done.message(), markup=False)  # (before a --wait)
        if wait and done.state == "requested":
            job = wait_for_job(store, job_id, timeout=timeout)
        job = shown_job(store, job)  # a subject's error: opened, or erased
    if as_json:
        output.emit_json({**job_doc(job), "cancel": done.to_dict()})
        return
    show_job(job)
