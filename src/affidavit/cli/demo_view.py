"""Human rendering of ``affidavit demo``."""

from __future__ import annotations

from rich.panel import Panel
from rich.table import Table

from affidavit.cli.output import out
from affidavit.demo import StoreDemoResult


def render(result: StoreDemoResult) -> None:
    out.print(Panel.fit("affidavit demo: a hash-chained, tamper-evident job log", style="bold"))
    table = Table("v", "type", "chain_hash (H_v)", title=f"job {result.job_id}")
    for e in result.events:
        table.add_row(str(e.version), e.type, e.chain_hash[:24] + "…")
    out.print(table)
    mark = "[green]intact[/]" if result.intact.ok else "[red]BROKEN[/]"
    out.print(f"recomputed chain over {result.intact.event_count} stored events: {mark}")
    out.print(f"event_chain_root_hash = {result.intact.root}")
    out.print(
        f"\nnow editing the stored payload of version {result.tampered_version} "
        "(refund amount 4200 → 42000) directly in the database file …"
    )
    if not result.tampered.ok:
        out.print(
            f"[bold green]tampering detected[/]: first bad version = "
            f"{result.tampered.first_bad_version}"
        )
    else:
        out.print("[bold red]tampering NOT detected[/]")
    out.print(f"\ndatabase: sqlite:///{result.db_path}")
    out.print(f"inspect it: affidavit jobs events {result.job_id} --db sqlite:///{result.db_path}")
