"""``affidavit run | submit | worker | signal | resume | cancel``: executing jobs and the human
decisions on them."""

from __future__ import annotations

import json
import math
import os
import signal as signals  # (``signal`` is the command below)
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened_for_job, state
from affidavit.cli.log_cmds import background_sequencer
from affidavit.cli.next_steps import decisions_doc, next_steps
from affidavit.cli.operator import AsOption, principal_of
from affidavit.cli.progress import StepProgress, job_line, status_markup
from affidavit.core.canonical import canonical, loads_unique
from affidavit.core.config import database_url
from affidavit.core.errors import ConfigError
from affidavit.core.inputs import read_limited_text
from affidavit.core.parks import RESUME_DECISIONS
from affidavit.core.plan import Plan
from affidavit.runtime import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_RECOVERIES,
    DEFAULT_STORE_RETRY_SECONDS,
    Agent,
    InvalidStateError,
    Runtime,
    Worker,
    check_agent_input,
    check_idempotency_key,
    check_input_references,
    check_plan,
    load_tools,
    open_store_waiting,
    registry,
    resolve_agent,
    resume_job,
    signal_job,
)
from affidavit.store import JobFilter, JobRecord

EXIT_WAITING = 4

ToolsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--tools",
        help="Module (dotted name) or .py file that registers tools; repeatable.",
        show_default=False,
    ),
]
MIN_LEASE_SECONDS = 0.1


def lease_option(what: str, default: float) -> Any:
    """The ``--lease-seconds`` option: ``what`` the lease is, and its default."""
    return typer.Option(
        "--lease-seconds",
        min=MIN_LEASE_SECONDS,
        help=f"{what} (default $AFFIDAVIT_LEASE_SECONDS, else {default:g}).",
        show_default=False,
    )


LeaseOption = Annotated[
    float | None, lease_option("How long a claim lasts without a heartbeat", DEFAULT_LEASE_SECONDS)
]
StoreRetryOption = Annotated[
    float | None,
    typer.Option(
        "--store-retry-seconds",
        min=0,
        help="How long a run keeps trying a write while the database is unavailable (a "
        "restart, a failover, a busy lock) before it leaves the job to be reclaimed (default "
        "$AFFIDAVIT_STORE_RETRY_SECONDS, else 60).",
        show_default=False,
    ),
]

MaxOutageOption = Annotated[
    float | None,
    typer.Option(
        "--max-outage-seconds",
        min=0,
        help="Give up (exit 3) once the database has been unavailable this long in a row: every "
        "claim failing, or every run giving up (default $AFFIDAVIT_MAX_OUTAGE_SECONDS, else "
        "wait until it is back).",
        show_default=False,
    ),
]

MaxRecoveriesOption = Annotated[
    int | None,
    typer.Option(
        "--max-recoveries",
        min=0,
        help="Recoveries in a row of a job whose runs ended without handing it back or "
        "recording a step's outcome (a step that kills its worker) before it is parked as "
        "crash_loop instead of run again (default $AFFIDAVIT_MAX_RECOVERIES, else 5).",
        show_default=False,
    ),
]


class ReplayMode(StrEnum):
    strict = "strict"
    warn = "warn"
    human = "human"


ReplayVerificationOption = Annotated[
    ReplayMode | None,
    typer.Option(
        "--replay-verification",
        help="What a recorded side effect the world no longer matches does on pickup: strict "
        "(fail the job), warn (record and go on), human (park). Default: the plan's, else "
        "strict.",
        show_default=False,
    ),
]
StepConcurrencyOption = Annotated[
    int,
    typer.Option(
        "--step-concurrency",
        min=1,
        max=64,
        help="Independent nodes of one job run at once (their tools overlap; every step keeps "
        "its T1/T2 protocol).",
    ),
]
InputOption = Annotated[
    str | None,
    typer.Option("--input", help="Job input: a JSON object, or @file.json.", show_default=False),
]


def seconds_setting(value: float | None, env: str, default: float, *, zero_ok: bool) -> float:
    """``value`` if given, else the environment variable ``env``, else ``default``."""
    if value is not None:
        return value
    text = os.environ.get(env)
    if text:
        try:
            parsed = float(text)
        except ValueError:
            raise ConfigError(f"{env}={text!r} is not a number") from None
        if parsed < 0 or (parsed == 0 and not zero_ok) or parsed != parsed:
            raise ConfigError(f"{env} must be {'≥ 0' if zero_ok else 'positive'}")
        return parsed
    return default


def lease_seconds(value: float | None) -> float:
    lease = seconds_setting(value, "AFFIDAVIT_LEASE_SECONDS", DEFAULT_LEASE_SECONDS, zero_ok=False)
    if not math.isfinite(lease):  # a claim that never expires would hold a dead worker's job
        raise ConfigError("the lease must be a finite number of seconds", hint="The default is 15.")
    if lease < MIN_LEASE_SECONDS:  # the bound --lease-seconds has, for the environment too
        raise ConfigError(
            f"the lease must be at least {MIN_LEASE_SECONDS} seconds, not {lease}",
            hint="The default is 15.",
        )
    return lease


def max_recoveries(value: int | None) -> int:
    """``value`` if given, else ``$AFFIDAVIT_MAX_RECOVERIES``, else the default (5)."""
    if value is not None:
        return value
    text = os.environ.get("AFFIDAVIT_MAX_RECOVERIES")
    if not text:
        return DEFAULT_MAX_RECOVERIES
    try:
        parsed = int(text)
    except ValueError:
        raise ConfigError(f"AFFIDAVIT_MAX_RECOVERIES={text!r} is not a whole number") from None
    if parsed < 0:
        raise ConfigError("AFFIDAVIT_MAX_RECOVERIES must be ≥ 0")
    return parsed


def parse_json_arg(text: str | None, what: str) -> Any:
    """A JSON value from ``text`` or, with a leading ``@``, from that file (an object giving
    a key twice is refused, as in plan files)."""
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = read_limited_text(text[1:], f"{what} file", limit=state.max_input_bytes)
        except OSError as exc:
            raise ConfigError(f"cannot read {what} file {text[1:]!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{what} file {text[1:]!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from exc
    try:
        return loads_unique(text)
    except ValueError as exc:  # not JSON, or a key given twice
        raise ConfigError(f"{what} is not valid JSON: {exc}") from exc


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


def open_runtime(
    db: str | None,
    tools: list[str] | None,
    lease: float | None,
    step_concurrency: int = 1,
    store_retry: float | None = None,
    recoveries: int | None = None,
    max_outage: float | None = None,
    *,
    wait_for_store: bool = False,
    jobs_at_once: int = 1,
) -> Runtime:
    """The runtime the commands run on. ``wait_for_store`` (a worker): a database that is
    unavailable when it starts is waited for, as a worker waits for it later
    (``--max-outage-seconds`` bounds both), instead of failing at once; it runs up to
    ``jobs_at_once`` jobs at once, and opens a connection for each, one for their heartbeats
    and one for the log's sequencer from the start."""
    for spec in tools or []:
        load_tools(spec)
    retry = seconds_setting(
        store_retry, "AFFIDAVIT_STORE_RETRY_SECONDS", DEFAULT_STORE_RETRY_SECONDS, zero_ok=True
    )
    outage = seconds_setting(max_outage, "AFFIDAVIT_MAX_OUTAGE_SECONDS", math.inf, zero_ok=True)
    outage_limit = outage if math.isfinite(outage) else None
    url = database_url(db)
    store = (
        open_store_waiting(url, max_outage_seconds=outage_limit, connections=jobs_at_once + 2)
        if wait_for_store
        else None
    )
    rt = Runtime(
        url,
        store=store,
        lease_seconds=lease_seconds(lease),
        step_concurrency=step_concurrency,
        store_retry_seconds=retry,
        max_recoveries=max_recoveries(recoveries),
        max_outage_seconds=outage_limit,
    )
    from affidavit.integrations.otel import enabled_by_env

    if enabled_by_env():  # OTEL_* configures spans of the jobs this process runs
        from affidavit.integrations.otel import instrument_from_env

        instrument_from_env(rt)
    return rt


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
    ``decisions`` (:func:`~affidavit.cli.next_steps.decisions_doc`)."""
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
    if decisions:
        for line in next_steps({"job_id": job.job_id, **decisions}):
            output.err.print(line, markup=False, highlight=False, soft_wrap=True)


AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="Run the agent registered under this name (by @affidavit.agent in a --tools "
        "module) instead of a plan; --input holds its keyword arguments.",
        show_default=False,
    ),
]


def run(
    plan: Annotated[
        Path | None, typer.Argument(help="Plan file (.yaml, .yml or .json); or use --agent.")
    ] = None,
    agent: AgentOption = None,
    tools: ToolsOption = None,
    input: InputOption = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="The same key returns (and resumes) the same job.")
    ] = None,
    replay_verification: ReplayVerificationOption = None,
    step_concurrency: StepConcurrencyOption = 1,
    lease: LeaseOption = None,
    store_retry: StoreRetryOption = None,
    recoveries: MaxRecoveriesOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a job and run it in this process until it completes, fails, waits or parks.

    Ctrl-C or SIGTERM stops it after the step that is running (which records its outcome) and
    hands the job back for `affidavit worker`; a second signal stops it at once.

    Exit codes: 0 completed; 1 failed or cancelled; 4 waiting or parked (a human is needed);
    3 usage or store error (nothing is submitted); 128 + the signal's number when stopped by
    a signal (130 Ctrl-C, 143 SIGTERM).
    """
    with command(as_json):
        parsed, job_input = prepared_job(plan, tools, input, lease, idempotency_key, agent)
        max_recoveries(recoveries)  # a bad environment variable submits nothing
        rt = open_runtime(db, None, lease, step_concurrency, store_retry, recoveries)
        try:
            rt.sealer.admit(rt.store)  # a key that cannot seal refuses the job before submitting
            job = rt.submit(
                parsed,
                job_input,
                idempotency_key=idempotency_key,
                replay_verification=replay_verification.value if replay_verification else None,
            )
            stop = Interrupted()
            if not job.terminal:
                what = "the step that is running; the job is handed back"
                try:
                    with graceful_stop(rt.worker, quiet=as_json, what=what) as stop:
                        if as_json:
                            job = rt.run_job(job.job_id)
                        else:
                            output.err.print(f"job {job.job_id}: running")
                            with StepProgress(
                                rt.store, job.job_id, output.err, after_version=job.version
                            ):
                                job = rt.run_job(job.job_id)
                except KeyboardInterrupt:
                    if not as_json:
                        output.err.print(
                            f"[yellow]stopped at once[/]: job {job.job_id} may be left with a "
                            "step in flight; a worker recovers it when its lease expires"
                        )
                    raise typer.Exit(128 + (stop.signum or signals.SIGINT)) from None
            if stop.signum is not None and job.status in ("pending", "running"):
                if as_json:
                    output.emit_json(job_doc(job))
                else:
                    output.err.print(
                        f"job {job.job_id}: stopped by {signals.Signals(stop.signum).name} and "
                        "handed back; `affidavit worker` continues it"
                    )
                raise typer.Exit(128 + stop.signum)
            if job.status in ("pending", "running"):
                until = (
                    datetime.fromtimestamp(job.lease_expires_at, UTC).isoformat(timespec="seconds")
                    if job.lease_expires_at is not None
                    else "unknown"
                )
                raise InvalidStateError(
                    f"job {job.job_id} is held by worker {job.lease_owner} (lease until "
                    f"{until}); it was not run here",
                    hint="Wait for that worker, or for its lease to expire and run again.",
                )
            decisions = None if as_json else decisions_doc(rt.store, job)  # (the next: lines)
        finally:
            rt.close()
    emit_job(job, as_json, decisions)
    raise typer.Exit(exit_for(job.status))


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
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate and enqueue a job for workers; nothing runs here.

    Exit codes: 0 enqueued (or already there, with the same idempotency key); 3 invalid plan,
    unknown tool, bad input or store error (nothing is written).
    """
    with command(as_json):
        parsed, job_input = prepared_job(
            plan, tools, input, idempotency_key=idempotency_key, agent=agent
        )
        rt = open_runtime(db, None, None)  # the tools are loaded
        try:
            job = rt.submit(
                parsed,
                job_input,
                idempotency_key=idempotency_key,
                replay_verification=replay_verification.value if replay_verification else None,
            )
        finally:
            rt.close()
    if as_json:
        output.emit_json({"job_id": job.job_id, "status": job.status})
    else:
        output.out.print(job.job_id)


def worker(
    tools: ToolsOption = None,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit when no runnable job is left.")
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Jobs run at once.")] = 1,
    step_concurrency: StepConcurrencyOption = 1,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve this worker's Prometheus counters (steps by outcome, ledger decisions, "
            "confirmations) at http://127.0.0.1:PORT/metrics.",
            show_default=False,
        ),
    ] = None,
    lease: LeaseOption = None,
    store_retry: StoreRetryOption = None,
    recoveries: MaxRecoveriesOption = None,
    max_outage: MaxOutageOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Claim and run jobs (pending ones, and running ones whose lease expired).

    Without --until-idle it polls until stopped. Ctrl-C or SIGTERM stops it gracefully: it
    claims nothing more, lets each running step record its outcome, and hands its jobs back
    (their leases expire at once, so another worker continues them); a second signal stops it
    at once. A job whose last runs each ended without handing it back or recording a step's
    outcome (a step that kills its worker) is parked as crash_loop after --max-recoveries of
    them. While the database is unavailable — also when the worker starts — it waits and tries
    again, until it is back or, with --max-outage-seconds, until it has been unavailable that
    long.
    Exit codes: 0 done; 3 usage or store error (a database unavailable past
    --max-outage-seconds included).
    """
    with command(as_json):
        rt = open_runtime(
            db,
            tools,
            lease,
            step_concurrency,
            store_retry,
            recoveries,
            max_outage,
            wait_for_store=True,
            jobs_at_once=concurrency,
        )
        try:
            if metrics_port is not None:
                try:
                    rt.metrics.serve(metrics_port)
                except OSError as exc:
                    message = f"cannot serve metrics on port {metrics_port}: {exc}"
                    raise ConfigError(message) from exc
            if not as_json:
                output.err.print(
                    f"worker {rt.worker.worker_id} on {rt.store.backend}"
                    + (" (until idle)" if until_idle else " (Ctrl-C to stop)")
                )
                traced = rt.worker.on_job  # (spans, when OTEL_* configures them)

                def on_job(job_id: str, status: str, seconds: float) -> None:
                    output.err.print(job_line(job_id, status, seconds), highlight=False)
                    if traced is not None:
                        traced(job_id, status, seconds)

                rt.worker.on_job = on_job
            try:
                from affidavit.runtime import background_scheduler

                with (
                    background_sequencer(rt.store),
                    background_scheduler(rt.store, rt.tools, lease_seconds=rt.worker.lease_seconds),
                    graceful_stop(rt.worker, quiet=as_json),
                ):
                    jobs_run = rt.worker.run(until_idle=until_idle, concurrency=concurrency)
                if until_idle and not as_json:
                    note = held_elsewhere_note(rt.store.list_jobs(HELD_ELSEWHERE), time.time())
                    if note:
                        output.err.print(note, highlight=False)
            except KeyboardInterrupt:
                jobs_run = rt.worker.jobs_run
                if not as_json:
                    output.err.print(
                        "[yellow]stopped at once[/]: a step that was running may be left in "
                        "flight; its job is recovered when its lease expires"
                    )
        finally:
            rt.close()
    if as_json:
        output.emit_json({"jobs_run": jobs_run})
    else:
        output.out.print(f"jobs run: {jobs_run}")


# The running jobs an until-idle worker looks at when it is done (more would only lengthen the
# note: it names three and counts the rest of these).
HELD_ELSEWHERE = JobFilter(status=("running",), limit=1000)


def held_elsewhere_note(running: list[JobRecord], now: float) -> str:
    """What ``worker --until-idle`` says when it exits leaving jobs running under another
    worker's live lease (``""`` if there are none): it never waits for one, and after a crash
    that lease is a dead worker's, which a user otherwise waits on without being told."""
    held = sorted(
        (j.lease_expires_at, j.job_id, j.lease_owner)
        for j in running
        if j.lease_expires_at is not None and j.lease_expires_at > now
    )
    if not held:
        return ""
    expires, _, owner = held[0]
    ids = ", ".join(job_id for _, job_id, _ in held[:3]) + (", ..." if len(held) > 3 else "")
    count = len(held)
    jobs = (
        "1 job is"
        if count == 1
        else f"{count:,}{'+' if count >= HELD_ELSEWHERE.limit else ''} jobs are"
    )
    return (
        f"[yellow]note[/]: {jobs} still running under another worker's lease, not waited for "
        f"({ids}; the first lease, {owner}'s, expires in {expires - now:,.0f} s). If that "
        "worker died, run the worker again once the lease has expired: the job is recovered then."
    )


@dataclass
class Interrupted:
    """Which signal asked for the stop, if one did."""

    signum: int | None = None


@contextmanager
def graceful_stop(
    worker: Worker,
    *,
    quiet: bool,
    what: str = "the steps that are running; their jobs are handed back to other workers",
) -> Iterator[Interrupted]:
    """While the block runs, the first SIGINT (Ctrl-C) or SIGTERM asks ``worker`` to stop
    gracefully (:meth:`~affidavit.runtime._worker.Worker.request_stop`); a second one raises
    :class:`KeyboardInterrupt` at once. The previous handlers are restored afterwards."""
    seen = Interrupted()

    def handle(signum: int, frame: FrameType | None) -> None:
        if seen.signum is not None:
            raise KeyboardInterrupt
        seen.signum = signum
        worker.request_stop()
        if not quiet:
            name = signals.Signals(signum).name
            output.err.print(f"{name}: stopping after {what} (signal again to stop at once)")

    if threading.current_thread() is not threading.main_thread():
        yield seen  # signal handlers can only be set in the main thread
        return
    previous = {s: signals.signal(s, handle) for s in (signals.SIGINT, signals.SIGTERM)}
    try:
        yield seen
    finally:
        for s, h in previous.items():
            signals.signal(s, h)


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
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resolve a parked job.

    Parked on an in-flight invocation: retry it, accept_result (a result a person checked), or
    fail. Parked because the world no longer matches a recorded side effect
    (replay_verification: human): continue (accept the world as it is) or fail. Parked as a
    crash loop (crash_loop): retry (once the cause is fixed) or fail. A resumed job is runnable
    again (run a worker). With --park VERSION the decision applies only to the park you looked
    at, not to a later one.

    Exit codes: 0 resolved; 2 no such job; 3 not parked, parked by another park than --park, a
    decision that does not fit, a bad option, or store error.
    """
    with command(as_json):
        value = parse_json_arg(result, "--result")
        with opened_for_job(db, job_id) as store:
            job = resume_job(
                store,
                job_id,
                decision,
                result=value,
                by=by or state_user(),
                note=note,
                park_version=park,
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


def state_user() -> str | None:
    return os.environ.get("USER") or None


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("submit")(submit)
    app.command("worker")(worker)
    app.command("signal")(signal)
    app.command("resume")(resume)
    from affidavit.cli.cancel_cmds import cancel

    app.command("cancel")(cancel)
