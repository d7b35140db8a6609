"""Benchmark steps per second: durable tool steps and pure steps against DBOS Transact and the
physical floor of the tool-step protocol.

On SQLite (fresh files in one temporary directory), in one run on one machine:

* affidavit: one job of 2,000 trivial chained steps (each step's args reference the previous
  step's output), once with durable ``tool`` steps (T1 synced, T2 written) and once with
  ``pure`` steps (one written transaction each);
* DBOS Transact (PyPI ``dbos``, SQLite system database, its default durability): one workflow
  of 2,000 trivial ``@DBOS.step()`` calls, each fed the previous step's result;
* the floor of our protocol: per step, one synced single-row commit (``synchronous=FULL``)
  plus one written single-row commit (``synchronous=NORMAL``) on a fresh WAL-mode file; the
  next synced commit covers the written one, exactly as T1 of the next step covers T2.

affidavit and DBOS each run in a fresh subprocess per repetition: *whole-process* is the time
from spawn to exit (import, open the database, submit, run, close), *in-process* the time of the
run alone (``Runtime.run_until_idle()``; the workflow call for DBOS), reported by the child.
The floor runs in this process (in-process only).

On PostgreSQL (a fresh schema per repetition, dropped afterwards): many small jobs (default
200 jobs × 5 chained tool steps), run by 1 worker process and by 4 worker processes.

Results are printed and written to this benchmark's section of ``docs/PERFORMANCE.md``.

Usage (from the repository root)::

    python -m benchmarks.bench_steps                  # everything; writes docs/PERFORMANCE.md
    python -m benchmarks.bench_steps --quick --no-write   # smoke test
    python -m benchmarks.bench_steps --profile        # where a tool step's time goes (no write)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    PERFORMANCE_MD,
    Machine,
    byte_compile_affidavit,
    cpu_ticks,
    describe_machine,
    fmt_rate,
    markdown_table,
    median,
    plural,
    spread,
    steal_share,
    steal_text,
    write_section,
    yes_no,
)
from benchmarks.steps_pg import CONCURRENCY, GOAL_VS_DBOS_PG, PgComparison, measure_pg, reachable
from benchmarks.steps_profile import run_profile
from benchmarks.steps_sqlite import (
    DEFAULT_PG_URL,
    FLOOR_PAYLOAD,
    GOAL_VS_DBOS,
    GOAL_VS_FLOOR,
    QUICK_SIZES,
    SECTION,
    SIZES,
    Case,
    DbosInfo,
    Goal,
    Sizes,
    console,
    dbos_version,
    plan_parse_seconds,
    run_affidavit,
    run_dbos,
    run_floor,
    write_children,
)

# --- the whole measurement ------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    sqlite_cases: dict[str, Case]
    dbos: DbosInfo
    pg: PgComparison | None
    parse_full_s: float
    parse_quarter_s: float
    filesystem: str


def filesystem_of(path: Path) -> str:
    """``/dev/vda (ext4)``: the mount that holds ``path``, from ``/proc/mounts``."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    target = str(path.resolve())
    best = ("", "unknown", "unknown")
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = parts[0], parts[1], parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, device, fstype)
    return f"{best[1]} ({best[2]}, mounted at {best[0]})"


def measure(sizes: Sizes, pg_url: str | None) -> Results:
    version, error = dbos_version()
    dbos = DbosInfo(version, error)
    if error:
        console.print(f"[yellow]DBOS not measured: {error}[/yellow]")
    n = sizes.steps
    cases = {
        "tool": Case(
            "tool",
            "affidavit, durable `tool` steps",
            "T1 synced (`synchronous=FULL`) + T2 written (`NORMAL`), WAL",
            n,
        ),
        "pure": Case(
            "pure", "affidavit, `pure` steps", "one written (`NORMAL`) transaction, WAL", n
        ),
        "dbos": Case("dbos", f"DBOS Transact {version or ''} `@DBOS.step()`".strip(), "", n),
        "floor": Case(
            "floor",
            "Floor: 1 synced + 1 written single-row commit",
            "`synchronous=FULL` commit + `NORMAL` commit, WAL",
            n,
        ),
    }
    with tempfile.TemporaryDirectory(prefix="bench_steps_") as tmp_name:
        tmp = Path(tmp_name)
        fs = filesystem_of(tmp)
        scripts = write_children(tmp)
        reps = max(sizes.reps, sizes.dbos_reps)
        for rep in range(reps):
            jobs: list[tuple[str, Callable[[], None]]] = []
            if rep < sizes.reps:
                jobs += [
                    (
                        "tool",
                        lambda r=rep: run_affidavit(
                            cases["tool"], "tool", tmp, scripts["affidavit"], r
                        ),
                    ),
                    (
                        "pure",
                        lambda r=rep: run_affidavit(
                            cases["pure"], "pure", tmp, scripts["affidavit"], r
                        ),
                    ),
                    ("floor", lambda r=rep: run_floor(cases["floor"], tmp, r)),
                ]
            if rep < sizes.dbos_reps and dbos.error is None:
                jobs.append(
                    ("dbos", lambda r=rep: run_dbos(cases["dbos"], dbos, tmp, scripts["dbos"], r))
                )
            shift = rep % len(jobs)  # rotate the order so no case always runs first
            for key, job in jobs[shift:] + jobs[:shift]:
                job()
                case = cases[key]
                whole = f", whole-process {case.whole_runs[-1]:,.0f}" if case.whole_s else ""
                console.print(
                    f"  rep {rep + 1}: {case.label}: in-process "
                    f"{case.inproc_runs[-1]:,.0f}{whole} steps/s"
                )
        parse_full = plan_parse_seconds(n)
        parse_quarter = plan_parse_seconds(max(n // 4, 1))
        pg: PgComparison | None = None
        if pg_url is not None:
            console.print(
                f"  PostgreSQL: {sizes.pg_jobs} jobs × {sizes.pg_steps} tool steps, "
                f"{sizes.pg_reps} repetition(s)"
            )
            pg = measure_pg(
                pg_url, sizes.pg_jobs, sizes.pg_steps, sizes.pg_reps, tmp, console.print
            )
    if dbos.error is not None:
        del cases["dbos"]
    return Results(cases, dbos, pg, parse_full, parse_quarter, fs)


def goals(results: Results) -> list[Goal]:
    cases = results.sqlite_cases
    tool_case = cases["tool"]
    dbos = cases.get("dbos")
    inproc = tool_case.inproc / dbos.inproc if dbos is not None else None
    whole = (
        tool_case.whole / dbos.whole
        if dbos is not None and tool_case.whole is not None and dbos.whole is not None
        else None
    )
    return [
        Goal("Tool steps/s ÷ DBOS steps/s, in-process", inproc, GOAL_VS_DBOS, "times"),
        Goal("Tool steps/s ÷ DBOS steps/s, whole-process", whole, GOAL_VS_DBOS, "times"),
        Goal(
            "Tool steps/s ÷ floor steps/s, in-process",
            tool_case.inproc / cases["floor"].inproc,
            GOAL_VS_FLOOR,
            "share",
        ),
        Goal(
            "PostgreSQL: tool steps/s ÷ DBOS steps/s, whole-process",
            results.pg.ratio if results.pg is not None else None,
            GOAL_VS_DBOS_PG,
            "times",
        ),
    ]


# --- report ---------------------------------------------------------------------------------


def bullet(text: str) -> str:
    """A markdown list item wrapped at 100 columns."""
    return textwrap.fill(
        text,
        width=100,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def workers_text(n: int) -> str:
    return f"{n} worker process" if n == 1 else f"{n} worker processes"


def dbos_durability(info: DbosInfo) -> str:
    d = info.durability
    if not d or "error" in d:
        return "SQLite defaults (DBOS sets no `journal_mode` or `synchronous`)"
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(d.get("synchronous"), "?")
    return f"its default: `journal_mode={d.get('journal_mode')}`, `synchronous={sync}`"


SQLITE_HEADERS = [
    "Case",
    "Durability per step",
    "In-process steps/s",
    "Whole-process steps/s",
    "Whole-process s",
]
GOAL_HEADERS = ["Goal", "Measured", "Target", "Met?"]
PG_HEADERS = ["Case", "Steps/s", "vs DBOS", "Per-step p50"]


def sqlite_rows(results: Results) -> list[list[str]]:
    rows = []
    for key, case in results.sqlite_cases.items():
        durability = dbos_durability(results.dbos) if key == "dbos" else case.durability
        whole_s = f"{median(case.whole_s):.2f}" if case.whole_s else "—"
        rows.append([case.label, durability, fmt_rate(case.inproc), fmt_rate(case.whole), whole_s])
    return rows


def goal_rows(gs: Sequence[Goal]) -> list[list[str]]:
    return [[g.label, g.measured_text(), g.target_text(), yes_no(g.met)] for g in gs]


def pg_rows(pg: PgComparison) -> list[list[str]]:
    dbos = median(pg.dbos) if pg.dbos else None

    def vs(rates: list[float]) -> str:
        return f"{median(rates) / dbos:.2f}×" if dbos and rates else "—"

    def p50(ms: list[float]) -> str:
        return f"{median(ms):.2f} ms" if ms else "—"

    return [
        [
            f"affidavit `worker --until-idle --concurrency {CONCURRENCY}` (whole process)",
            fmt_rate(median(pg.affidavit)),
            vs(pg.affidavit),
            p50(pg.step_p50_ms),
        ],
        [
            f"DBOS Transact, {CONCURRENCY} threads (whole process)",
            fmt_rate(dbos) if dbos else f"not measured: {pg.dbos_error}",
            "1.00×" if dbos else "—",
            "—",
        ],
        [
            f"Floor: the protocol's SQL, {CONCURRENCY} connections (T1 + T2, one round trip each)",
            fmt_rate(median(pg.floor)),
            vs(pg.floor),
            p50(pg.floor_p50_ms),
        ],
    ]


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 or h in ("Durability per step",) else "right")
    for row in rows:
        table.add_row(*[c.replace("**", "").replace("`", "") for c in row])
    console.print(table)


def print_results(results: Results, gs: Sequence[Goal], sizes: Sizes) -> None:
    print_table(
        f"SQLite: one job of {sizes.steps:,} trivial chained steps (median)",
        SQLITE_HEADERS,
        sqlite_rows(results),
    )
    print_table("Goals", GOAL_HEADERS, goal_rows(gs))
    if results.pg is not None:
        print_table("PostgreSQL: many jobs (median)", PG_HEADERS, pg_rows(results.pg))


def notes(results: Results, sizes: Sizes) -> tuple[str, str]:
    cases = results.sqlite_cases
    tool_case, pure_case = cases["tool"], cases["pure"]
    lines = []
    for case in cases.values():
        whole = f"; whole-process {spread(case.whole_runs)}" if case.whole_s else ""
        lines.append(bullet(f"{case.label}: in-process {spread(case.inproc_runs)}{whole}"))
    dbos_case = cases.get("dbos")
    if dbos_case is not None and dbos_case.inproc_s:
        # Each repetition runs affidavit and DBOS seconds apart: the ratio within a repetition
        # is not moved by the disk getting faster or slower between repetitions.
        def ratios(ours: list[float], theirs: list[float]) -> str:
            return ", ".join(f"{b / a:.1f}×" for a, b in zip(ours, theirs, strict=False))

        lines.append(
            bullet(
                "Tool steps/s ÷ DBOS steps/s within each repetition (the two run seconds apart): "
                f"in-process {ratios(tool_case.inproc_s, dbos_case.inproc_s)}; whole-process "
                f"{ratios(tool_case.whole_s, dbos_case.whole_s)}"
            )
        )
    ranges = "\n".join(lines) + "\n"

    def s(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f} s"

    startup = [
        f"affidavit child (tool job): import {s(tool_case.detail('import_s'))}, open the "
        f"database {s(tool_case.detail('open_s'))}, submit (build + validate + write the "
        f"{sizes.steps:,}-step plan) {s(tool_case.detail('submit_s'))}; pure job: submit "
        f"{s(pure_case.detail('submit_s'))}"
    ]
    dbos = cases.get("dbos")
    if dbos is not None:
        startup.append(
            f"DBOS child: import {s(dbos.detail('import_s'))}, configure + launch "
            f"{s(dbos.detail('open_s'))}"
        )
    growth = results.parse_full_s / results.parse_quarter_s if results.parse_quarter_s else 0.0
    quarter = max(sizes.steps // 4, 1)
    startup.append(
        f"`Plan.parse` of the chained plan: {results.parse_quarter_s * 1e3:,.0f} ms at "
        f"{quarter:,} steps, {results.parse_full_s * 1e3:,.0f} ms at {sizes.steps:,} steps "
        f"(×{growth:.1f} for 4× the steps"
        + ("; super-linear" if growth > 6 else "")
        + "). Submit validates the plan, and the runner parses it again when it claims the job, "
        "so the second parse is inside the in-process time."
    )
    return ranges, "\n".join(bullet(line) for line in startup) + "\n"


def markdown(
    machine: Machine,
    results: Results,
    gs: Sequence[Goal],
    sizes: Sizes,
    runtime_s: float,
    steal: float | None,
    quick: bool,
) -> str:
    ranges, startup = notes(results, sizes)
    warning = (
        "\n> **Quick mode (`--quick`)**: smoke-test sizes; these numbers are not representative.\n"
        if quick
        else ""
    )
    dbos = results.dbos
    if dbos.error is None:
        dbos_text = (
            f"DBOS Transact {dbos.version} (PyPI `dbos`) with a SQLite system database "
            f'(`DBOS(config={{"name": …, "system_database_url": "sqlite:///…", '
            f'"log_level": "WARNING"}})`), at {dbos_durability(dbos)}: every step\'s output '
            "is committed to the system database before the workflow continues. After each run "
            f"the benchmark counted the workflow's rows in `operation_outputs`: "
            f"{', '.join(f'{p:,}' for p in dbos.persisted)} (want {sizes.steps:,}), and its "
            "status `SUCCESS`."
        )
    else:
        dbos_text = f"DBOS Transact was **not measured**: {dbos.error}."
    description = "\n".join(
        bullet(text)
        for text in (
            f"affidavit: one plan of {sizes.steps:,} nodes, each taking the previous node's output "
            '(`"prev": "${s<k-1>}"`), run by `Runtime.run_until_idle()`; the tool returns its '
            "index. A durable `tool` step writes T1 (ledger row + `node_started`, "
            "`tool_invocation_started`; `synchronous=FULL`) before the tool runs and T2 "
            "(`tool_invocation_finished`, `command_committed`, `node_finished`, ledger row "
            "committed; `synchronous=NORMAL`) after it. A `pure` step writes one "
            "`synchronous=NORMAL` transaction.",
            f"{dbos_text} The workflow calls a trivial `@DBOS.step()` {sizes.steps:,} times, "
            "each given the previous step's result.",
            "Floor: the physical minimum of our protocol, per step one synced single-row commit "
            "plus one written single-row commit (autocommit `INSERT`s of a "
            f"{len(FLOOR_PAYLOAD)}-byte row on one connection of the store's driver, `apsw`, "
            "switching `synchronous` between "
            "`FULL` and `NORMAL`) on a fresh WAL file; each synced commit also makes the previous "
            "written one durable, as T1 of the next step does for T2.",
            "In-process = the run alone (`run_until_idle()`; for DBOS the workflow call), timed "
            "inside the child. Whole-process = a fresh Python subprocess per repetition (import, "
            "open the database, build and submit the plan or launch DBOS, run, close), timed "
            "from spawn to exit. Every child uses a fresh database file; the floor runs in the "
            "benchmark process. Cases alternate their order between repetitions: "
            f"{plural(sizes.reps, 'repetition')} of the affidavit cases and the floor, "
            f"{plural(sizes.dbos_reps, 'repetition')} of DBOS.",
        )
    )
    pg_part = ""
    pg = results.pg
    if pg is not None:
        pg_text = "\n".join(
            bullet(text)
            for text in (
                f"{pg.jobs:,} jobs of {pg.steps} chained trivial tool steps on the same PostgreSQL "
                "server, whole process each (spawn to exit). affidavit: the jobs are submitted "
                "into a fresh schema (not timed), then one `affidavit worker --until-idle "
                f"--concurrency {CONCURRENCY}` runs them (import, connect, claim, T1 synced + T2 "
                "per step, complete, seal). DBOS: one process starts the same number of "
                f"workflows of {pg.steps} `@DBOS.step()` calls from {CONCURRENCY} threads, system "
                "database in a fresh database on the server.",
                "Floor: the statements of T1 (ledger insert + 2 events, `synchronous_commit=on`) "
                f"and T2 (ledger update + 3 events, not waited for) per step as plain SQL from "
                f"{CONCURRENCY} connections, each "
                "transaction one message of statements (one round trip, values bound on the "
                "client, the events one multi-row insert) as the store sends them; no hashing, "
                "no runtime around them.",
                "Round trips per tool step in affidavit: two, the minimum (T1 must be durable "
                "before the tool acts, T2 comes after it). T1: the ledger insert, presumed new, "
                "goes unanswered with the started events and the commit; T2: the closing events "
                "and the ledger row with the commit. Both appends are checked on the server by "
                "`affidavit_append_guard` in the message that carries the commit. Per job of N "
                "steps: 2N + 1 (the job's end, with its seal, is one message, which also carries "
                "the worker's next claim, and that claim brings the job's log back). The "
                "statements in those messages are prepared once per connection and sent as "
                "`EXECUTE` with their values as literals; the worker opens a connection per job "
                "slot before its first claim.",
                "Per-step p50: affidavit, from a step's `tool_invocation_started` to its "
                "`node_finished` (the two timestamps in the log; T1's commit, the tool, T2's "
                "writes); floor, T1 + T2 timed around the two round trips.",
                f"Median of {plural(len(pg.affidavit), 'repetition')}: affidavit "
                f"{spread(pg.affidavit)}, DBOS {spread(pg.dbos) if pg.dbos else '—'}, floor "
                f"{spread(pg.floor)} steps/s; the case order rotates between repetitions.",
            )
        )
        pg_part = f"""
### PostgreSQL: {pg.jobs:,} jobs × {pg.steps} tool steps, affidavit vs DBOS

{pg_text}

{markdown_table(PG_HEADERS, pg_rows(pg), "lrrr")}"""
    return f"""
## Steps per second vs DBOS Transact and the commit floor (`benchmarks/bench_steps.py`)
{warning}
Measured on:

{machine.markdown()}- Benchmark runtime: {runtime_s:.0f} s; {steal_text(steal)}
- SQLite files in a temporary directory on {results.filesystem}

### SQLite: one job of {sizes.steps:,} trivial chained steps

{description}

{markdown_table(SQLITE_HEADERS, sqlite_rows(results), "llrrr")}
{markdown_table(GOAL_HEADERS, goal_rows(gs), "lrll")}
Median (min–max) of the repetitions, steps/s:

{ranges}
Start-up and plan costs (medians):

{startup}
`python -m benchmarks.bench_steps --profile` prints where a tool step's time goes (cProfile of
the in-process run; the run vs the store layer alone vs the floor; CPU parts timed alone).
{pg_part}"""


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument(
        "--no-write", action="store_true", help=f"do not update {PERFORMANCE_MD.name}"
    )
    parser.add_argument("--output", type=Path, default=PERFORMANCE_MD, help="markdown file")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AFFIDAVIT_BENCH_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL to benchmark (env AFFIDAVIT_BENCH_PG_URL); a fresh schema is used",
    )
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL cases")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the in-process SQLite tool-step run instead: print where the time goes, "
        "in µs/step; writes nothing",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.profile:
        run_profile(sizes)
        return 0
    pg_version = None if args.no_pg else reachable(args.pg_url, console.print)
    machine = describe_machine(pg_version)
    for key, value in machine.rows():
        console.print(f"[dim]{key}:[/dim] {value}")
    busy = os.getloadavg()[0]
    if busy > 0.5:
        console.print(
            f"[yellow]warning: load average {busy:.2f} at start: other processes compete for "
            "CPU and disk, so the numbers will be noisy[/yellow]"
        )

    byte_compile_affidavit()
    started = time.perf_counter()
    ticks = cpu_ticks()
    results = measure(sizes, args.pg_url if pg_version is not None else None)
    runtime = time.perf_counter() - started
    steal = steal_share(ticks, cpu_ticks())
    gs = goals(results)

    print_results(results, gs, sizes)
    ranges, startup = notes(results, sizes)
    console.print(ranges + startup, markup=False, highlight=False)
    console.print(f"Total benchmark runtime: {runtime:.1f} s; {steal_text(steal)}")
    if not args.no_write:
        body = markdown(machine, results, gs, sizes, runtime, steal, args.quick)
        write_section(SECTION, body, args.output)
        console.print(f"Wrote the {SECTION} section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
