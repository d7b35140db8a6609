"""How a job is shown once a command has acted on it (``run``, ``signal``, ``resume``,
``cancel``, ``jobs wait``): its JSON document, its human form and the exit code its status
gives."""

from __future__ import annotations

import json
import os
from typing import Any

from affidavit.cli import output
from affidavit.cli.next_steps import next_steps
from affidavit.cli.progress import status_markup
from affidavit.store import JobRecord

EXIT_WAITING = 4


def job_doc(job: JobRecord) -> dict[str, Any]:
    """``{"job_id","status","output","error"}``, and ``unreadable`` when the stored output or
    error is not JSON (see :meth:`JobRecord.unreadable_doc`)."""
    return {
        "job_id": job.job_id,
        "status": job.status,
        "output": job.output,
        "error": job.error,
        **job.unreadable_doc(),
    }


def exit_for(status: str) -> int:
    if status in ("waiting", "parked"):
        return EXIT_WAITING
    return 1 if status in ("failed", "cancelled") else 0


def emit_job(job: JobRecord, as_json: bool, decisions: dict[str, Any] | None = None) -> None:
    """Print the job a decision left: JSON with ``--json``, else as :func:`show_job`."""
    if as_json:
        output.emit_json(job_doc(job))
    else:
        show_job(job, decisions)


def show_job(job: JobRecord, decisions: dict[str, Any] | None = None) -> None:
    """The job in human form: its status (stderr), its output (stdout; a long one cut), its
    error, and for a waiting or parked job the ``next:`` commands of ``jobs show`` from
    ``decisions`` (:func:`~affidavit.cli.next_steps.decisions_doc`); for a pending one (a
    signal or a decision made it runnable), that a worker must claim it."""
    output.err.print(f"job {job.job_id}: {status_markup(job.status)}")
    if job.output is not None:
        text = json.dumps(job.output, ensure_ascii=False)
        shown, was_cut = output.cut(text)
        if was_cut:
            output.out.print(shown, markup=False, highlight=False, soft_wrap=True)
            output.cut_note("output", len(text), f"affidavit jobs show {job.job_id} --json")
        else:
            output.out.print_json(text)
    error = job.error
    if isinstance(error, dict) and error.get("message"):
        kind = f" ({error['type']})" if error.get("type") else ""
        message, _ = output.cut(str(error["message"]))
        output.err.print(f"error: {message}{kind}", markup=False)
    elif error is not None:  # (JSON, never a Python repr)
        message, _ = output.cut(error if isinstance(error, str) else json.dumps(error))
        output.err.print(f"error: {message}", markup=False)
    for column, why in job.unreadable_doc().get("unreadable", {}).items():
        output.err.print(f"{column}: unreadable — {why}", markup=False)
    if decisions is not None:
        for line in next_steps({"job_id": job.job_id, "status": job.status, **decisions}):
            output.err.print(line, markup=False, highlight=False, soft_wrap=True)


def state_user() -> str | None:
    return os.environ.get("USER") or None
