"""``affidavit run`` and ``affidavit worker``: running jobs on the runtime, in this process,
with a graceful stop on the first Ctrl-C or SIGTERM."""

from __future__ import annotations

import math
import signal as signals
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command
from affidavit.cli.job_view import emit_job, exit_for, job_doc
from affidavit.cli.log_cmds import background_sequencer
from affidavit.cli.next_steps import decisions_doc
from affidavit.cli.progress import StepProgress, job_line
from affidavit.cli.queue_cmds import WorkerQueuesOption
from affidavit.cli.run_options import (
    AgentOption,
    InputOption,
    LeaseOption,
    MaxOutageOption,
    MaxRecoveriesOption,
    ReplayVerificationOption,
    StepConcurrencyOption,
    StoreRetryOption,
    ToolsOption,
    lease_seconds,
    max_recoveries,
    seconds_setting,
)
from affidavit.cli.submit_cmds import prepared_job
from affidavit.cli.worker_processes import watch_supervisor, write_report
from affidavit.core.config import DEFAULT_STORE_RETRY_SECONDS, database_url
from affidavit.core.errors import ConfigError
from affidavit.runtime import (
    InvalidStateError,
    Runtime,
    Worker,
    load_tools,
    open_store_waiting,
)
from affidavit.store import JobFilter, JobRecord, Store


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
    queues: list[str] | None = None,
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
        queues=queues or None,
    )
    from affidavit.integrations.otel import enabled_by_env

    if enabled_by_env():  # OTEL_* configures spans of the jobs this process runs
        from affidavit.integrations.otel import instrument_from_env

        instrument_from_env(rt)
    return rt


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
            job = _run_here(rt, job, as_json)
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


def _run_here(rt: Runtime, job: JobRecord, as_json: bool) -> JobRecord:
    """Run the job ``rt`` just submitted in this process (unless it has ended already); a signal
    stops it after the running step and exits with 128 + the signal's number."""
    stop = Interrupted()
    if not job.terminal:
        what = "the step that is running; the job is handed back"
        try:
            with graceful_stop(rt.worker, quiet=as_json, what=what) as stop:
                if as_json:
                    job = rt.run_job(job.job_id)
                else:
                    output.err.print(f"job {job.job_id}: running")
                    with StepProgress(rt.store, job.job_id, output.err, after_version=job.version):
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
    return job


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
    queue: WorkerQueuesOption = None,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Worker processes under one supervisor, each running --concurrency jobs at "
            "once (a killed one is started again; signals reach them all).",
        ),
    ] = 1,
    report_file: Annotated[Path | None, typer.Option("--report-file", hidden=True)] = None,
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
    With --processes N, a supervisor runs N worker processes (docs/runtime.md): it forwards
    signals, starts a killed one again, sums their counters at --metrics-port and stops them
    all (exit 3) on a child's usage or store error or a crash loop.
    Exit codes: 0 done; 3 usage or store error (a database unavailable past
    --max-outage-seconds included).
    """
    if processes > 1:
        options = _WorkerOptions(
            tools,
            until_idle,
            concurrency,
            step_concurrency,
            lease,
            store_retry,
            recoveries,
            max_outage,
            queue,
            db,
        )
        _supervise(options, processes, metrics_port, as_json)
        return
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
            queues=queue,
        )
        try:
            if metrics_port is not None:
                try:
                    rt.metrics.serve(metrics_port)
                except OSError as exc:
                    message = f"cannot serve metrics on port {metrics_port}: {exc}"
                    raise ConfigError(message) from exc
            if not as_json:
                _announce(rt, until_idle)
            if report_file is not None:
                watch_supervisor(rt.worker.request_stop)
            jobs_run = _run_worker(
                rt, until_idle, concurrency, quiet=as_json, note=report_file is None
            )
        finally:
            rt.close()
    if report_file is not None:
        write_report(report_file, jobs_run)
    if as_json:
        output.emit_json({"jobs_run": jobs_run})
    else:
        output.out.print(f"jobs run: {jobs_run}")


def _announce(rt: Runtime, until_idle: bool) -> None:
    """Say which worker runs on which database, then print a line as each run of a job ends
    (after the spans, if OTEL_* configures them)."""
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


def _run_worker(
    rt: Runtime, until_idle: bool, concurrency: int, *, quiet: bool, note: bool = True
) -> int:
    """Run ``rt``'s worker, with the sequencer, the scheduler and (when a policy is set)
    retention beside it, until it is idle (``until_idle``) or stopped; return how many jobs it
    ran. A second Ctrl-C stops it at once. ``note``: at the end, say which jobs are held by
    other workers' leases (a supervised worker leaves that to its supervisor)."""
    try:
        from affidavit.retention import background_retention
        from affidavit.runtime import background_scheduler

        with (
            background_sequencer(rt.store),
            background_scheduler(rt.store, rt.tools, lease_seconds=rt.worker.lease_seconds),
            background_retention(rt.store),
            graceful_stop(rt.worker, quiet=quiet),
        ):
            jobs_run = rt.worker.run(until_idle=until_idle, concurrency=concurrency)
        if until_idle and not quiet and note:
            _print_held_elsewhere(rt.store)
    except KeyboardInterrupt:
        jobs_run = rt.worker.jobs_run
        if not quiet:
            output.err.print(
                "[yellow]stopped at once[/]: a step that was running may be left in "
                "flight; its job is recovered when its lease expires"
            )
    return jobs_run


def _print_held_elsewhere(store: Store) -> None:
    note = held_elsewhere_note(store.list_jobs(HELD_ELSEWHERE), time.time())
    if note:
        output.err.print(note, highlight=False)


@dataclass(frozen=True)
class _WorkerOptions:
    """The options a supervisor gives each of its worker processes."""

    tools: list[str] | None
    until_idle: bool
    concurrency: int
    step_concurrency: int
    lease: float | None
    store_retry: float | None
    recoveries: int | None
    max_outage: float | None
    queues: list[str] | None
    db: str | None

    def argv(self, *, verbose: bool, as_json: bool) -> list[str]:
        """``affidavit [--verbose] worker ...`` with these options, for a child."""
        args = ["--verbose"] if verbose else []
        args += ["worker", "--concurrency", str(self.concurrency)]
        args += ["--step-concurrency", str(self.step_concurrency)]
        for spec in self.tools or []:
            args += ["--tools", spec]
        for name in self.queues or []:
            args += ["--queue", name]
        for option, value in [
            ("--lease-seconds", self.lease),
            ("--store-retry-seconds", self.store_retry),
            ("--max-recoveries", self.recoveries),
            ("--max-outage-seconds", self.max_outage),
            ("--db", self.db),
        ]:
            if value is not None:
                args += [option, str(value)]
        if self.until_idle:
            args.append("--until-idle")
        if as_json:
            args.append("--json")
        return args


def _supervise(
    options: _WorkerOptions, processes: int, metrics_port: int | None, as_json: bool
) -> None:
    """``worker --processes N`` (:mod:`affidavit.cli.worker_processes`): the options are
    checked here first (a bad one exits 3 before any process starts)."""
    from affidavit.cli.common import opened, state
    from affidavit.cli.worker_processes import Supervisor, serve_summed_metrics

    with command(as_json):
        database_url(options.db)
        for spec in options.tools or []:
            load_tools(spec)
        lease_seconds(options.lease)
        max_recoveries(options.recoveries)
        supervisor = Supervisor(
            options.argv(verbose=state.verbose, as_json=as_json),
            processes,
            until_idle=options.until_idle,
            quiet=as_json,
            metrics=metrics_port is not None,
        )
        if metrics_port is not None:
            try:
                serve_summed_metrics(supervisor, metrics_port)
            except OSError as exc:
                message = f"cannot serve metrics on port {metrics_port}: {exc}"
                raise ConfigError(message) from exc
        if not as_json:
            output.err.print(
                f"worker supervisor: {processes} processes of {options.concurrency} job(s) at "
                "once" + (" (until idle)" if options.until_idle else " (Ctrl-C to stop)")
            )
        outcome = supervisor.run()
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
        if options.until_idle and not as_json:
            with opened(options.db, read_only=True) as store:
                _print_held_elsewhere(store)
    if as_json:
        output.emit_json(
            {"jobs_run": outcome.jobs_run, "processes": processes, "restarts": outcome.restarts}
        )
    else:
        output.out.print(f"jobs run: {outcome.jobs_run}")


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
