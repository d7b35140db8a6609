"""``affidavit jobs``: inspect jobs and their event logs."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened, opened_for_job
from affidavit.cli.job_view import emit_job, exit_for, job_doc, state_user
from affidavit.cli.next_steps import decisions_doc, next_steps
from affidavit.cli.output import escape
from affidavit.cli.progress import StepProgress, status_markup
from affidavit.cli.run_options import InputOption, parse_json_arg, seconds_setting
from affidavit.core.config import DEFAULT_STORE_RETRY_SECONDS
from affidavit.core.errors import AffidavitError, JobNotFound, WaitTimeout
from affidavit.record import (
    SubjectView,
    family_doc,
    fork_lineage,
    job_input,
    recovered_steps,
    recovery_text,
    seal_document,
    shown_job,
)
from affidavit.store import JOB_STATUSES, JobFilter, JobRecord, Store, StoredEvent
from affidavit.store.tags import read_tags, tag_filter, with_tags

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_INTERRUPTED = 130

jobs_app = typer.Typer(help="Inspect jobs and their event logs.", no_args_is_help=True)


@jobs_app.command("list")
def list_jobs(
    status: Annotated[
        list[str] | None,
        typer.Option("--status", help=f"Only these statuses ({', '.join(JOB_STATUSES)})."),
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="Only this namespace.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many (newest first).")] = 0,
    before: Annotated[
        str | None,
        typer.Option(
            metavar="JOB",
            help="Only jobs listed after JOB: the next page is --before <the last job id of "
            "this one>. Cheap at any depth (an offset steps over every job it skips) and "
            "stable while new jobs arrive.",
        ),
    ] = None,
    parent: Annotated[
        str | None, typer.Option(metavar="JOB", help="Only the child jobs of JOB.")
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag",
            metavar="KEY=VALUE",
            help="Only jobs with this tag; repeatable (every one must match).",
            show_default=False,
        ),
    ] = None,
    archived: Annotated[
        bool,
        typer.Option(
            "--archived",
            help="Instead: the jobs retention removed from the live store (newest first), "
            "each with its seal's hash and its pack's path (`affidavit verify JOB` checks it).",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first, each with its input (cut to 60 characters). A job retention
    removed is not listed (see --archived).

    Exit codes: 0 listed; 2 no job JOB (--before); 3 bad filter or store error.
    """
    if archived:
        from affidavit.cli.retention_cmds import list_archived

        list_archived(namespace, limit, db, as_json)
        return
    with command(as_json), opened(db, read_only=True) as store:
        jobs = store.list_jobs(
            JobFilter(
                status=status or None,
                namespace=namespace,
                limit=limit,
                offset=offset,
                before=before,
                parent=parent,
                tags=tag_filter(tag or ()),
            )
        )
        tags = read_tags(store, [j.job_id for j in jobs]) if as_json else {}
        if as_json:  # a subject's output and error: opened, or shown erased
            jobs = [shown_job(store, j) for j in jobs]
        # each job's input, as its job_created recorded it (the human table only: --json lists
        # the job objects, and `jobs show` / `jobs trace --json` hold the whole input)
        inputs = {} if as_json else {j.job_id: _input_cell(store, j.job_id) for j in jobs}
    if as_json:
        output.emit_json(
            [j.to_dict() | ({"tags": tags[j.job_id]} if j.job_id in tags else {}) for j in jobs]
        )
        return
    if not jobs:
        output.err.print("no jobs")
        return
    headers = ("job_id", "status", "plan", "namespace", "events", "created_at", "input")
    rows = [
        (
            j.job_id,
            j.status,
            j.plan_name or "",
            j.namespace,
            str(j.version),
            j.created_at,
            inputs[j.job_id],
        )
        for j in jobs
    ]
    if len(rows) > output.RICH_TABLE_ROWS:
        output.plain_table(headers, rows)
    else:
        table = output.table()
        table.add_column("job_id", no_wrap=True, min_width=36)  # an id is copied, never cut
        table.add_column("status", no_wrap=True, min_width=9)
        for name in headers[2:]:
            table.add_column(name)
        for row in rows:  # (text from the database: never read as markup)
            table.add_row(*map(escape, row))
        output.out.print(table)
    if len(jobs) == limit:  # (on stderr: the table on stdout stays just the table)
        output.out.file.flush()  # (so that the two streams, when merged, stay in order)
        output.err.print(f"next page: --before {escape(jobs[-1].job_id)}")


INPUT_CELL_CHARS = 60  # a job's input in `jobs list`, cut to this many characters
# what JSON leaves unescaped of the control characters (DEL, C1): shown as "?", so that an input
# never sends escape sequences to the terminal
_DEL_AND_C1 = dict.fromkeys(range(0x7F, 0xA0), "?")


def _input_cell(store: Store, job_id: str) -> str:
    """The job's input as compact JSON, cut to :data:`INPUT_CELL_CHARS` (``?`` when its
    ``job_created`` cannot be read: `affidavit verify JOB` says why)."""
    try:
        # (a subject's input opened while its key exists, else shown as erased)
        value = SubjectView(store, job_id).value(job_input(store.list_events(job_id, limit=1)))
    except AffidavitError:  # (an event row changed outside affidavit: the list still lists)
        return "?"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # (C0 escaped)
    return output.cut(text, INPUT_CELL_CHARS)[0].translate(_DEL_AND_C1)


@jobs_app.command("show")
def show_job(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one job. A waiting job also lists what it waits for (the correlation keys to
    `affidavit signal`); a parked job why it is parked (what `affidavit resume` decides) and
    the park's version (what `affidavit resume --park` pins).

    Exit codes: 0 shown; 2 no such job; 3 store error.
    """
    from affidavit.store.queue_grants import job_queue_claims

    with command(as_json), opened(db, read_only=True) as store:
        job = archived_or_job(store, job_id)
        # (a subject's: opened or erased)
        doc = with_tags(store, shown_job(store, job).to_dict())
        sealed = seal_document(store, job_id)  # what `verify_events(..., seal=...)` takes
        doc["seal"] = sealed["seal"]
        if sealed["error"] is not None:
            doc["seal_error"] = sealed["error"]
        lineage = fork_lineage(store.list_events(job_id, limit=1))
        if lineage is not None:  # a fork: its source job, step and the source's seal hash
            doc["forked_from"] = lineage
        doc.update(family_doc(store, job_id))
        doc.update(decisions_doc(store, job))
        recovered = recovered_steps(store.iter_events(job_id))
        if recovered:  # calls a later attempt recovered after the attempt that made them died
            doc["recovered"] = recovered
        claims = job_queue_claims(store, job_id, time.time())
        if claims:  # a job of a named queue: each claim's grant (none for the default queue)
            doc["queue_claims"] = claims
    if as_json:
        output.emit_json(doc)
        return
    table = output.table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # long ids and hashes wrap whole, never cut
    cut: list[tuple[str, int]] = []
    for key, value in doc.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if key == "lease_expires_at" and isinstance(value, int | float):  # (Unix time in JSON)
            text = datetime.fromtimestamp(value, UTC).isoformat(timespec="microseconds")
            text = text.replace("+00:00", "Z")
        shown, was_cut = output.cut(text)
        if was_cut:
            cut.append((key, len(text)))
        table.add_row(f"[bold]{key}[/]", escape(shown))  # (never read as markup)
    output.out.print(table)
    for key, length in cut:
        output.cut_note(key, length, f"affidavit jobs show {job_id} --json")
    for entry in doc.get("recovered", []):
        output.out.print(f"recovered {recovery_text(entry)}", markup=False, highlight=False)
    for line in next_steps(doc):
        output.out.print(escape(line), highlight=False, soft_wrap=True)  # (copied whole)


def archived_or_job(store: Store, job_id: str) -> JobRecord:
    """The job ``job_id``.

    Raises:
        JobArchived: retention removed it (the error says where its pack went).
        JobNotFound: no such job.
    """
    try:
        return store.get_job(job_id)
    except JobNotFound:
        from affidavit.retention import JobArchived, archived_job

        tomb = archived_job(store, job_id)
        if tomb is not None:
            raise JobArchived(tomb) from None
        raise


@jobs_app.command("wait")
def wait_job(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0,
            help="Give up after this many seconds (exit 124). Default: as long as it takes.",
            show_default=False,
        ),
    ] = None,
    store_retry: Annotated[
        float | None,
        typer.Option(
            "--store-retry-seconds",
            min=0,
            help="How long the wait goes on while the database is unavailable (a restart, a "
            "failover) before it gives up with exit 3 (default $AFFIDAVIT_STORE_RETRY_SECONDS, "
            "else 60).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Wait until a job that workers run is settled: finished, or needing a person (waiting
    for a signal or approval, or parked). Prints each step as it is recorded (stderr), then the
    job as `run` does; with --json only {"job_id","status","output","error"}. Nothing is run
    or written here. A database that goes away meanwhile (a restart, a failover) is waited
    for, up to --store-retry-seconds in a row.

    Exit codes: 0 completed; 1 failed or cancelled; 4 waiting or parked (a human is needed);
    124 still pending or running after --timeout; 130 interrupted; 2 no such job; 3 store
    error.
    """
    from affidavit.runtime import SETTLED_STATUSES, wait_for_job

    timed_out = None
    with command(as_json), opened(db, read_only=True) as store:
        retry = seconds_setting(
            store_retry, "AFFIDAVIT_STORE_RETRY_SECONDS", DEFAULT_STORE_RETRY_SECONDS, zero_ok=True
        )
        job = store.get_job(job_id)
        try:
            if as_json or job.status in SETTLED_STATUSES:
                job = wait_for_job(store, job_id, timeout=timeout, store_retry_seconds=retry)
            else:
                output.err.print(f"job {job_id}: {status_markup(job.status)}; waiting")
                with StepProgress(store, job_id, output.err, after_version=job.version):
                    job = wait_for_job(store, job_id, timeout=timeout, store_retry_seconds=retry)
        except WaitTimeout as exc:
            job, timed_out = exc.job, exc
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        decisions = None if as_json or timed_out else decisions_doc(store, job)  # (next: lines)
    if timed_out is not None:
        if as_json:
            output.emit_json(job_doc(job))
        else:
            output.err.print(f"[yellow]{timed_out.message}[/]; {timed_out.hint}")
        raise typer.Exit(EXIT_TIMEOUT)
    emit_job(job, as_json, decisions)
    raise typer.Exit(exit_for(job.status))


@jobs_app.command("watch")
def watch_job(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    after_version: Annotated[
        int, typer.Option(min=0, help="Only events after this version (to pick up again).")
    ] = 0,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0,
            help="Give up after this many seconds (exit 124). Default: as long as it takes.",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Follow a job as it runs: each value its code emits (`ctx.emit`) on stdout, one JSON
    value a line, the moment it is recorded, and each other event on stderr — until the job
    is finished, waits for a signal or a person, or is parked; then the job as `run` prints
    it. With --json, stdout has JSON lines only: each event as `jobs events --json` shows it,
    then {"job_id","status","output","error"}. Nothing is run or written here.

    Exit codes: 0 completed; 1 failed or cancelled; 4 waiting or parked (a human is needed);
    124 still pending or running after --timeout; 130 interrupted; 2 no such job; 3 store
    error.
    """
    from affidavit.record import follow_job

    with command(as_json), opened(db, read_only=True) as store:
        store.get_job(job_id)  # a clear "not found" before anything is followed
        followed = follow_job(store, job_id, after_version, timeout=timeout)
        try:
            while True:
                try:
                    event = next(followed)
                except StopIteration as done:
                    status = done.value
                    break
                _watched(event, as_json)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        job = store.get_job(job_id)
        decisions = None if as_json or status is None else decisions_doc(store, job)
    if status is None:
        if as_json:
            _line(job_doc(job))
        else:
            output.err.print(f"[yellow]job {job_id} is still {job.status} after {timeout:g} s[/]")
        raise typer.Exit(EXIT_TIMEOUT)
    if as_json:
        _line(job_doc(job))
    else:
        emit_job(job, False, decisions)
    raise typer.Exit(exit_for(job.status))


def _watched(event: StoredEvent, as_json: bool) -> None:
    """One event of ``jobs watch``: a stream value on stdout, any other event on stderr (all
    on stdout as JSON lines with --json). Written at once: a reader of the pipe sees it now."""
    if as_json:
        _line(event.to_dict())
    elif event.type == "stream_emitted":
        _line(event.payload.get("value"))
    else:
        node = event.payload.get("node_id") if isinstance(event.payload, dict) else None
        where = f" {node}" if node else ""
        output.err.print(f"v{event.version} {event.type}{where}", markup=False, highlight=False)


def _line(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
    sys.stdout.flush()


@jobs_app.command("events")
def job_events(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    after_version: Annotated[int, typer.Option(min=0, help="Only events after this version.")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="A subject's job: show the stored envelopes, not the opened values."
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a job's event log in version order, with each event's chain hash.

    With --json: a list of {"version","event_id","type","payload","chain_hash"}; the stored
    bytes of each payload are exactly its RFC 8785 canonical JSON. A job with a subject shows
    its sealed values opened while the subject's key exists, and each as erased after; --raw shows
    what is stored (and hashed): the envelopes.

    Exit codes: 0 printed; 2 no such job; 3 an event row changed outside affidavit (a field of
    another type; with --json also a stored payload that is not JSON: replay_error, naming the
    job and version), or store error.
    """
    with command(as_json), opened(db, read_only=True) as store:
        job = store.get_job(job_id)  # a clear "not found" rather than an empty list
        view = None if raw else SubjectView(store, job_id)
        if view is not None and not view.subject:
            view = None
        shown = max(job.version - after_version, 0)
        if not as_json and min(shown, limit or shown) > output.RICH_TABLE_ROWS:
            # a long log: plain columns, printed page by page as they are read
            widths = (len(str(job.version)), _TYPE_WIDTH, 32, 17)
            stream = store.iter_events(job_id, after_version=after_version, limit=limit)
            if view is not None:
                stream = (view.events([e])[0] for e in stream)
            output.plain_columns(_EVENT_COLUMNS, widths, map(_event_row, stream))
            return
        events = store.list_events(job_id, after_version=after_version, limit=limit)
        if view is not None:
            events = view.events(events)
        docs = [e.to_dict() for e in events] if as_json else []
    if as_json:
        output.emit_json(docs)
        return
    table = output.table()
    table.add_column("v", no_wrap=True)
    table.add_column("type", no_wrap=True, min_width=_TYPE_WIDTH)
    table.add_column("event_id", no_wrap=True, min_width=32)
    table.add_column("chain_hash", no_wrap=True, min_width=17)
    table.add_column("payload", overflow="fold")
    for e in events:  # (text from the database: never read as markup)
        table.add_row(*map(escape, _event_row(e)))
    output.out.print(table)


_EVENT_COLUMNS = ("v", "type", "event_id", "chain_hash", "payload")
_TYPE_WIDTH = 24


def _event_row(e: StoredEvent) -> tuple[str, str, str, str, str]:
    """The cells of an event in ``jobs events``: the payload cut to 80 characters."""
    text = e.payload_bytes.decode("utf-8", "replace")  # (an edited row may hold anything)
    payload = text if len(text) <= 80 else text[:79] + "…"
    return str(e.version), e.type, e.event_id, e.chain_hash[:16] + "…", payload


def _plan_rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    headers = ("node", "type", "state", "attempts", "duration ms", "depends on")
    rows: list[tuple[str, ...]] = [
        (
            n["id"],
            n["type"],
            n["state"],
            str(n["attempts"]),
            "" if n["duration_ms"] is None else f"{n['duration_ms']:.1f}",
            ", ".join(n["depends_on"]),
        )
        for n in doc["nodes"]
    ]
    return headers, rows


def _agent_rows(doc: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """An agent job's steps in sequence order: kind, tool, state, attempts, duration, waits."""
    headers = ("step", "kind", "tool", "state", "attempts", "duration ms", "waits")
    rows: list[tuple[str, ...]] = [
        (
            n["id"],
            n["type"],
            n["tool"] or "",
            n["state"],
            str(n["attempts"]),
            "" if n["duration_ms"] is None else f"{n['duration_ms']:.1f}",
            ", ".join(_wait_text(w) for w in n.get("waits") or []),
        )
        for n in doc["nodes"]
    ]
    return headers, rows


def _wait_text(wait: dict[str, Any]) -> str:
    answered = f" by {wait.get('signalled_by')}" if "answered_at" in wait else " (open)"
    return f"{wait.get('wait_type')} {wait.get('correlation_key')}{answered}"


@jobs_app.command("trace")
def job_trace_cmd(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each node of the job's plan with its state (pure, side_effect_committed, compensated,
    in_flight, waiting, approved, denied, signalled, parked, running, failed, unknown,
    pending, skipped), outcome, attempts and duration; for an agent job, each recorded step
    in sequence order with its kind, tool, state, attempts, duration and waits. A step whose
    call a later attempt recovered (caught up by reconcile, or re-run after a lost call) is
    named after the table, with the dead attempt's worker.

    Exit codes: 0 shown; 2 no such job; 3 a log that cannot be read (replay_error: an event row
    changed outside affidavit, named by job and version) or store error.
    """
    from affidavit.record import job_trace

    with command(as_json), opened(db, read_only=True) as store:
        doc = job_trace(store, job_id)
    if as_json:
        output.emit_json(doc)
        return
    job = doc["job"]
    output.out.print(f"job {job['job_id']}: [bold]{job['status']}[/] ({doc['event_count']} events)")
    headers, rows = _agent_rows(doc) if doc.get("kind") == "agent" else _plan_rows(doc)
    if len(rows) > output.RICH_TABLE_ROWS:
        output.plain_table(headers, rows)
        return
    table = output.table(*headers)
    for row in rows:  # (node ids come from the plan: never read as markup)
        table.add_row(*map(escape, row))
    output.out.print(table)
    for n in doc["nodes"]:  # (how a step's call was recovered after its attempt died)
        for entry in n.get("recovered") or []:
            text = recovery_text({"node_id": n["id"], **entry})
            output.out.print(f"recovered {text}", markup=False, highlight=False)


@jobs_app.command("fork")
def fork_job_cmd(
    job_id: Annotated[str, typer.Argument(help="The finished job to fork.")],
    from_step: Annotated[
        str,
        typer.Option(
            "--from-step",
            help="The last reused step: a plan node id, an agent step's #SEQ (0-based) or a "
            "step id.",
        ),
    ],
    input: InputOption = None,
    by: Annotated[str | None, typer.Option(help="Who forks (recorded).")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="The same key (in the source's namespace) returns the same fork; another "
            "source, step or input with it is refused.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a new job that reuses the job's recorded steps up to and including --from-step
    (they are not run again: their results are the recorded ones) and runs the rest with the
    code deployed now; --input replaces the input for the steps that run. The new job waits
    for a worker like a submitted one; `affidavit verify` checks its reused steps against the
    source's record.

    Exit codes: 0 created; 2 no such job; 3 the job has no seal yet (not finished), no such
    step, bad --input, an --idempotency-key used for another fork, or store error (nothing
    is written).
    """
    from affidavit.runtime import fork_job

    with command(as_json):
        # (checked before the database is opened: a bad --input creates nothing)
        args = (parse_json_arg(input, "--input"),) if input is not None else ()
        with opened_for_job(db, job_id) as store:
            job = fork_job(
                store,
                job_id,
                from_step,
                *args,
                submitted_by=by or state_user(),
                idempotency_key=idempotency_key,
            )
            lineage = fork_lineage(store.list_events(job.job_id, limit=1))
            job = shown_job(store, job)
    if as_json:
        output.emit_json({**job.to_dict(), "forked_from": lineage})
        return
    output.err.print(f"job {job.job_id}: forked from {job_id} after step {from_step!r}")
    output.out.print(job.job_id, markup=False, highlight=False)
