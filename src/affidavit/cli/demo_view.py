"""Human rendering of ``affidavit demo``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rich.panel import Panel
from rich.table import Table

from affidavit.cli.output import out
from affidavit.demo import CRASH_AT, DemoResult


def render(result: DemoResult) -> None:
    out.print(Panel.fit("affidavit demo: a refund agent, a crash, and what really happened"))
    jobs = Table("order", "job", "run", "status", "refunds paid", "e-mails sent", "chain", "verify")
    for j in result.jobs:
        jobs.add_row(
            j.order_id,
            j.job_id,
            ("agent, " if j.agent else "")
            + (f"killed at {CRASH_AT}, recovered" if j.crashed else "clean"),
            f"[green]{j.status}[/]" if j.status == "completed" else f"[red]{j.status}[/]",
            _count(result.refunds[j.order_id]),
            _count(result.emails[j.order_id]),
            "[green]intact[/]" if j.chain.ok else "[red]BROKEN[/]",
            f"[green]✓ sealed by {j.verification.seal.key_id}[/]"
            if j.verification.ok
            else "[red]✗ " + ", ".join(c.name for c in j.verification.checks() if not c.ok) + "[/]",
        )
    out.print(jobs)
    crashed = next((j for j in result.jobs if j.crashed), None)
    if crashed is not None:
        events = Table("v", "type", "detail", title=f"events of the recovered job {crashed.job_id}")
        for e in crashed.events:
            p = e.payload
            detail = p.get("node_id", "")
            if e.type == "tool_invocation_finished":
                detail += f" outcome={p['outcome']}" + (" (catch-up)" if p.get("catch_up") else "")
            elif e.type == "node_finished":
                detail += f" {p['result_type']}"
            events.add_row(str(e.version), e.type, detail)
        out.print(events)
    out.print(
        f"child process exit code: {result.child_returncode} (−9 = killed by SIGKILL, "
        "after the refund was paid and before it was recorded)"
    )
    detected = not result.tamper_check.ok
    out.print(
        f"tampering with a copy (refund amount of event {result.tampered_version}): "
        + (
            f"[green]detected[/] at version {result.tamper_check.first_bad_version}"
            if detected
            else "[red]not detected[/]"
        )
    )
    failed = [c.name for c in result.tamper_verification.checks() if not c.ok]
    out.print(
        "affidavit verify on the tampered copy: "
        + (f"[green]fails[/] ({', '.join(failed)})" if failed else "[red]passes[/]")
    )
    for note in result.notes:
        out.print(f"[yellow]note:[/] {note}")
    out.print(f"\ndatabase: {result.database}")
    out.print(f"shop, payments ledger and outbox: {result.directory}/shop")
    command = f"{shell_command()} jobs events {result.jobs[-1].job_id} --db {result.database}"
    out.print(f"look: {command}", markup=False, highlight=False, soft_wrap=True)
    verdict = "[bold green]ok[/]" if result.ok else "[bold red]NOT ok[/]"
    out.print(f"demo {verdict} in {result.seconds:.1f} s")


def shell_command() -> str:
    """How the user's shell reaches this ``affidavit``: ``affidavit`` when that is on the PATH
    and is this one; else its path — relative to the working directory inside it (as
    ``.venv/bin/affidavit`` after ``make demo``, whose virtual environment is not activated)."""
    here = Path(sys.executable).parent / "affidavit"  # (not resolved: a venv's python links out)
    if not here.is_file():
        return f"{sys.executable} -m affidavit"
    found = shutil.which("affidavit")
    if found is not None and Path(found).resolve() == here.resolve():
        return "affidavit"
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


def _count(n: int) -> str:
    return f"[green]{n}[/]" if n == 1 else f"[red]{n}[/]"
