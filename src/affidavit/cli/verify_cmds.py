"""``affidavit verify`` (Verification Mode); the keys commands are in :mod:`keys_cmds`."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from typing import IO, TYPE_CHECKING, Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.output import escape
from affidavit.core.errors import ConfigError, JobNotFound
from affidavit.store import JOB_STATUSES, JobFilter, Store
from affidavit.verify import (
    CHECKS,
    ForkCheck,
    VerificationResult,
    verification_document,
    verify_all,
    verify_one_fork,
    verify_tree,
)

if TYPE_CHECKING:
    from affidavit.retention import ArchivedCheck


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)


# Long because typer reads the command's options from its signature and its --help from its
# docstring (so this reason is not there); the body itself is under 50 lines.
def verify(
    job_id: Annotated[
        str | None, typer.Argument(help="The job id (or --all).", show_default=False)
    ] = None,
    all_jobs: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Verify every job in the database, newest first (narrowed by --status and "
            "--namespace); without a filter, also report every job id whose events, ledger "
            "rows or seal remain without a job row (each fails); exit 1 if any job fails a "
            "check.",
        ),
    ] = False,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help=f"With --all: only these statuses ({', '.join(JOB_STATUSES)}). Repeatable.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", help="With --all: only this namespace.", show_default=False),
    ] = None,
    trusted_key: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-key",
            help="Accept seals only from this key: a base64 public key, or the key id of a key "
            "recorded in the database. Repeatable. Default: every recorded key.",
            show_default=False,
        ),
    ] = None,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree",
            help="With a job id: verify the job and every descendant (child jobs), and that "
            "each child is the one its parent recorded (its chain head, length and seal "
            "hash); exit 1 if any job or link fails.",
        ),
    ] = False,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            help="Instead of jobs: check, from the queue's recorded grants since --since, that "
            "no window held more starts than its rate and no instant more running claims than "
            "its concurrency (and per worker); exit 1 if a limit did not hold or cannot be "
            "proved.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[
        str | None,
        typer.Option(
            "--limit",
            help="Instead of jobs: check, from the grants every job's log records since "
            "--since, that no window held more calls of the tool or model limit than its "
            "recorded rate and no instant more in flight than its recorded concurrency; exit 1 "
            "if it did not hold.",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="With --queue or --limit: from this time (ISO 8601 with a zone).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a job (any status) without changing anything: execution hash, event chain root,
    tool-invocation ledger proof, replay proof, stored chain and seal. With --all, every job
    that matches the filters when the command starts. A job id whose job row is gone but whose
    events, ledger rows or seal remain is reported as failing (no job row), not as unknown.

    With --all, also every agent's trust log and evidence: its chain, its seal (a log cut
    short no longer reaches it), the transparency log's leaves of its seals, the scores it
    states, and each evidence body against its id and its trust log entry.

    With --queue Q --since T: the queue's limits over its claims since T (docs/queues.md).
    With --limit NAME --since T: a tool or model limit over the grants the jobs' logs record
    since T (docs/limits.md).

    Exit codes: 0 every check holds (with --all: for every job and agent, also when there is
    none; with --queue or --limit: every limit held); 1 some check failed; 2 no such job; 3 usage or
    store error. A job retention removed exits 0 with status `archived` (its pack's path; the
    pack, when there, must still match its recorded SHA-256 and verify, else exit 1) or
    `removed` (no archive was kept); --all does not count them.
    """
    if queue is not None or limit is not None or since is not None:
        from affidavit.cli.queue_verify import verify_limit_cmd, verify_queue_cmd

        alone = job_id is None and not all_jobs and not status and namespace is None
        alone = alone and not trusted_key and not tree
        if limit is not None:
            verify_limit_cmd(limit, queue, since, db, as_json, alone=alone)
        else:
            verify_queue_cmd(queue, since, db, as_json, alone=alone)
        return
    if tree:
        _verify_tree_cmd(job_id, db, as_json, trusted_key or None)
        return
    archived: ArchivedCheck | None = None
    with command(as_json):
        _check_selection(job_id, all_jobs, status, namespace)
        with opened(db, read_only=True) as store:
            if job_id is None:
                filters = JobFilter(status=status or None, namespace=namespace)
                # Only the failures are kept: the table names them; --json writes every
                # result to a spool file as it comes (a result is ~1 KB; a job id ~100 bytes)
                with (
                    tempfile.TemporaryFile("w+", encoding="utf-8") if as_json else nullcontext()
                ) as spooled:
                    spool = _ResultSpool(spooled) if spooled is not None else None
                    total, failed = verify_all_shown(
                        store,
                        filters,
                        trusted_key or None,
                        show_progress=not as_json,
                        each=spool.add if spool is not None else None,
                    )
                    agents, bad_agents = verify_trust_logs(store, namespace)
                    if spool is not None:
                        spool.emit(total, failed, agents, bad_agents)
            else:
                try:
                    result, fork = verify_one_fork(store, job_id, trusted_keys=trusted_key or None)
                except JobNotFound:  # retention may have removed it (imported only then)
                    from affidavit.retention import check_archived

                    archived = check_archived(store, job_id)
                    if archived is None:
                        raise
    if job_id is not None and archived is not None:
        render_archived(archived, as_json)
        return
    if job_id is None:
        if not as_json:
            render_all(total, failed)
            render_trust_logs(agents, bad_agents)
        if failed or bad_agents:
            raise typer.Exit(output.EXIT_FAILED)
        return
    if as_json:
        output.emit_json(verification_document(result, fork))
    else:
        render(result)
        if fork is not None:
            render_fork(fork)
    if not result.ok or (fork is not None and not fork.ok):
        raise typer.Exit(output.EXIT_FAILED)


def render_archived(checked: ArchivedCheck, as_json: bool) -> None:
    """A job retention removed: ``archived`` (or ``removed``, no pack kept) and its pack's
    path; exit 1 when its pack no longer matches or its seal changed."""
    if as_json:
        output.emit_json(checked.to_dict())
    else:
        t = checked.tombstone
        mark = "[green]✓[/]" if checked.ok else "[bold red]✗[/]"
        what = f"job {escape(t.job_id)} is {checked.status} (removed from the live store at "
        what += f"{escape(t.archived_at)}; its seal stays in the transparency log)"
        output.out.print(f"{mark} {what}")
        if t.pack_path is not None:
            state = "checked" if checked.pack_present else "not there now"
            output.out.print(
                f"  pack: {escape(t.pack_path)} ({state}; sha256 {escape(t.pack_sha256 or '')})"
            )
        for problem in checked.problems:
            output.out.print(f"  [bold red]✗[/] {escape(problem)}")
    if not checked.ok:
        raise typer.Exit(output.EXIT_FAILED)


def render_fork(fork: ForkCheck) -> None:
    """The line of a fork's reused prefix under the table (ids from the database: escaped)."""
    what = f"fork of job {escape(fork.source_job_id)} up to step {escape(fork.step)}"
    if fork.status == "verified":
        output.out.print(f"[green]✓[/] {what}: reused steps match the source's sealed record")
    elif fork.status == "unverified":
        output.out.print(
            f"[yellow]?[/] {what}: reused steps unverified by reference (the source job is "
            "not in this database)"
        )
    else:
        output.out.print(f"[bold red]✗[/] {what}: {escape(fork.problem or 'failed')}")


def _verify_tree_cmd(
    job_id: str | None, db: str | None, as_json: bool, trusted_keys: list[str] | None
) -> None:
    """``verify JOB --tree``: every job of the tree as ``verify JOB`` shows it, then the links."""
    with command(as_json):
        if job_id is None:
            raise ConfigError("--tree takes a job id", hint="Run `affidavit verify JOB --tree`.")
        with opened(db, read_only=True) as store:
            result = verify_tree(store, job_id, trusted_keys=trusted_keys)
    if as_json:
        output.emit_json(result.to_dict())
    else:
        for each in result.results:
            render(each)
        for link in result.links:
            mark = "[red]✗[/red]" if link.problem else "[green]✓[/green]"
            detail = escape(link.problem) if link.problem else "as recorded"
            output.out.print(
                f"{mark} {escape(link.parent_job_id)} → {escape(link.child_job_id)}: {detail}"
            )
    if not result.ok:
        raise typer.Exit(output.EXIT_FAILED)


def _check_selection(
    job_id: str | None, all_jobs: bool, status: list[str] | None, namespace: str | None
) -> None:
    """One job or --all, never both; the filters only with --all. Checked before the database
    is opened, so a bad command line creates nothing."""
    hint = "Run `affidavit verify JOB` or `affidavit verify --all [--status S] [--namespace NS]`."
    if job_id is None and not all_jobs:
        raise ConfigError("give a job id or --all", hint=hint)
    if job_id is not None and all_jobs:
        raise ConfigError("give a job id or --all, not both", hint=hint)
    if job_id is not None and (status or namespace is not None):
        raise ConfigError("--status and --namespace only narrow --all", hint=hint)
    for s in status or ():
        if s not in JOB_STATUSES:
            raise ConfigError(f"unknown status {s!r}", hint=f"Statuses: {', '.join(JOB_STATUSES)}.")


def verify_all_shown(
    store: Store,
    filters: JobFilter,
    trusted_keys: list[str] | None,
    *,
    show_progress: bool,
    each: Callable[[VerificationResult], object] | None = None,
) -> tuple[int, list[VerificationResult]]:
    """:func:`~affidavit.verify.verify_all` with a progress bar on stderr while it runs."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        TimeElapsedColumn(),
        console=output.err,
        transient=True,
        disable=not show_progress,
    ) as bar:
        task = bar.add_task("verify", total=None)

        def started(count: int) -> None:
            bar.update(task, total=count)

        def shown(result: VerificationResult) -> None:
            if each is not None:
                each(result)
            if not result.orphan:
                bar.advance(task)

        return verify_all(store, filters, trusted_keys=trusted_keys, started=started, each=shown)


class _ResultSpool:
    """The results of ``verify --all --json``, written to a temporary file as they come and
    printed after the counts: the document ``output.emit_json`` would print for
    ``{"jobs", "verified", "failed", "failed_jobs", "orphans", "results"}``, byte for byte,
    without holding a result per job."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file  # (the caller closes it)
        self._count = 0

    def add(self, result: VerificationResult) -> None:
        # as json.dumps(indent=2) lays out an item of a list that is a value of the document
        item = json.dumps(result.to_dict(), ensure_ascii=False, indent=2)
        self._file.write((",\n" if self._count else "") + "    " + item.replace("\n", "\n    "))
        self._count += 1

    def emit(
        self,
        total: int,
        failed: list[VerificationResult],
        agents: int = 0,
        bad_agents: dict[str, list[str]] | None = None,
    ) -> None:
        head = {
            "jobs": total,
            "verified": total - len(failed),
            "failed": len(failed),
            "failed_jobs": [r.job_id for r in failed],
            "orphans": [r.job_id for r in failed if r.orphan],
            "agents": agents,
            "failed_agents": bad_agents or {},
            "results": [],
        }
        if not self._count:
            output.emit_json(head)
            return
        text = json.dumps(head, ensure_ascii=False, indent=2)
        sys.stdout.write(text.removesuffix("[]\n}") + "[\n")
        self._file.seek(0)
        shutil.copyfileobj(self._file, sys.stdout)
        sys.stdout.write("\n  ]\n}\n")
        sys.stdout.flush()


def verify_trust_logs(store: Store, namespace: str | None) -> tuple[int, dict[str, list[str]]]:
    """Check every agent's trust log (chain, seal, transparency-log leaves, scores) and
    evidence (of ``namespace``, or all): the number of agents and, by agent id, the problems
    of those that fail."""
    from affidavit.claims.service import ClaimService

    return ClaimService(store).check_trust_logs(namespace)


def render_trust_logs(agents: int, bad: dict[str, list[str]]) -> None:
    if not agents:
        return
    if not bad:
        output.out.print(f"[green]verified[/]: the trust logs and evidence of all {agents} agents")
        return
    table = output.table(title="agents NOT verified", title_justify="left")
    table.add_column("agent", no_wrap=True)
    table.add_column("problem", overflow="fold")
    for agent_id, problems in bad.items():
        for i, problem in enumerate(problems):
            table.add_row(escape(agent_id) if i == 0 else "", escape(problem))
    output.out.print(table)
    output.out.print(
        f"[bold red]NOT verified[/]: the trust log or evidence of {len(bad)} of {agents} agents"
    )


def render_all(total: int, failed: list[VerificationResult]) -> None:
    if not total:
        output.out.print("no jobs to verify")
        return
    if failed:
        table = output.table(title="jobs NOT verified", title_justify="left")
        table.add_column("job", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("failed check", no_wrap=True)
        table.add_column("detail", overflow="fold")
        for result in failed:
            bad = [c for c in result.checks() if not c.ok]
            # (ids, statuses and details come from the database: never read as markup)
            table.add_row(
                escape(result.job_id),
                _status_text(result),
                bad[0].name,
                escape(bad[0].detail),
            )
            for check in bad[1:]:
                table.add_row("", "", check.name, escape(check.detail))
        output.out.print(table)
        output.out.print(f"[bold red]NOT verified[/]: {len(failed)} of {total} jobs failed a check")
    else:
        output.out.print(f"[green]verified[/]: every check holds for all {total} jobs")


def _status_text(result: VerificationResult) -> str:
    """The job's status for a table (escaped: it comes from the database)."""
    return "no job row" if result.orphan else escape(str(result.status))


# the checks that report values (the hashes), and those the values stand on (docs/verification.md)
_VALUES = frozenset(c.name for c in CHECKS if not c.proof)
_RECORD = frozenset(c.name for c in CHECKS if c.record)


def render(result: VerificationResult) -> None:
    # (ids, statuses and details come from the database: never read as markup)
    title = f"job {escape(result.job_id)} ({_status_text(result)})"
    table = output.table(title=title, title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("detail", overflow="fold")
    # the two hashes are values, not checks: they stand for the record only when its stored
    # chain recomputes and its seal covers it; otherwise they are those of the rows as they are
    checks = result.checks()
    record = all(check.ok for check in checks if check.name in _RECORD)
    for check in checks:
        mark = "[green]✓[/]" if check.ok else "[bold red]✗[/]"
        detail = check.detail
        if check.name in _VALUES and not record:
            mark = "[yellow]?[/]"
            detail += " (of the rows as they are now: not the record's, which does not verify)"
        table.add_row(check.name, mark, escape(detail))
    output.out.print(table)
    if result.ok:
        output.out.print("[green]verified[/]: every check holds")
    else:
        failed = ", ".join(c.name for c in result.checks() if not c.ok)
        output.out.print(f"[bold red]NOT verified[/]: {failed} failed")
