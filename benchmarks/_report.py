"""Helpers shared by benchmarks: machine description, timing, and ``docs/PERFORMANCE.md``.

Every benchmark owns one section of ``docs/PERFORMANCE.md``, delimited by
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; :func:`write_section` replaces only that
section and leaves the rest of the file as it is. ``docs/PERFORMANCE.md`` is the short report
(what each benchmark measures, when and where, its tables and goals); the full write-up of the
latest run (method, medians with their spread, profiles) goes to ``benchmarks/results/NAME.md``.
"""

from __future__ import annotations

import compileall
import os
import platform
import re
import secrets
import sqlite3
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE_MD = REPO_ROOT / "docs" / "PERFORMANCE.md"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

FILE_HEADER = (
    "# Performance\n\n"
    "Numbers in this file are measured by `make bench`. Each benchmark's entry below links the\n"
    "full write-up of its latest run in `benchmarks/results/`: the method, the machine, the load\n"
    "and every number.\n"
)


@dataclass(frozen=True, slots=True)
class Machine:
    """What a set of numbers was measured on."""

    nproc: int
    cpu_model: str
    kernel: str
    python: str
    sqlite: str
    postgresql: str | None
    date: str
    load: str  # load average (1, 5, 15 min) when the benchmark started

    def markdown(self) -> str:
        pg = self.postgresql or "not measured"
        return (
            f"- Date: {self.date}\n"
            f"- CPU: {self.cpu_model}, `nproc` = {self.nproc}\n"
            f"- OS: Linux {self.kernel}\n"
            f"- Python {self.python}, SQLite {self.sqlite}, PostgreSQL server {pg}\n"
            f"- Load average at start: {self.load}\n"
        )

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("date", self.date),
            ("cpu", f"{self.cpu_model} (nproc={self.nproc})"),
            ("kernel", self.kernel),
            ("python", self.python),
            ("sqlite", self.sqlite),
            ("postgresql", self.postgresql or "not measured"),
            ("load average", self.load),
        ]


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "unknown CPU"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return platform.processor() or "unknown CPU"


def nproc() -> int:
    """What ``nproc`` prints: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def sqlite_versions() -> str:
    """The SQLite the store runs on (bundled with ``apsw``) and, when it differs, Python's own
    (what ``sqlite3`` users such as DBOS and SQLAlchemy run on)."""
    import apsw

    ours = apsw.sqlite_lib_version()
    if ours == sqlite3.sqlite_version:
        return ours
    return f"{ours} (affidavit, through `apsw`; Python's `sqlite3`: {sqlite3.sqlite_version})"


def describe_machine(postgresql_version: str | None) -> Machine:
    return Machine(
        nproc=nproc(),
        cpu_model=cpu_model(),
        kernel=platform.release(),
        python=platform.python_version(),
        sqlite=sqlite_versions(),
        postgresql=postgresql_version,
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load=load_average(),
    )


def byte_compile_affidavit() -> None:
    """Byte-compile affidavit's sources, as installing a package does. An editable install
    leaves ``src/`` to be compiled at first import, and where ``PYTHONDONTWRITEBYTECODE`` is
    set, every child process of a whole-process case would compile it again (~0.2 s here)
    while the baseline's installed packages load their compiled files."""
    import affidavit

    compileall.compile_dir(Path(affidavit.__file__).parent, quiet=1)


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) CPU ticks since boot from ``/proc/stat``; (0, 0) where unavailable."""
    try:
        fields = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return 0, 0
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)


def steal_share(start: tuple[int, int], end: tuple[int, int]) -> float | None:
    """Fraction of CPU time the hypervisor took from this VM between two :func:`cpu_ticks`."""
    total = end[1] - start[1]
    return (end[0] - start[0]) / total if total > 0 else None


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A GitHub markdown table; ``align`` has one ``l`` or ``r`` per column."""
    if len(align) != len(headers):
        raise ValueError("one alignment letter per column")
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def _goal_counts(table: list[str]) -> tuple[int, int]:
    """(met, not met) of a goal table: its cells under a heading naming "met" (else "goal")
    that say yes / met, or no / not met; a cell saying neither (a dash) is not counted."""
    head = [c.strip().lower() for c in table[0].strip("|").split("|")]
    cols = [k for k, h in enumerate(head) if re.search(r"\bmet\b", h)]
    cols = cols or [k for k, h in enumerate(head) if re.search(r"\bgoal\b", h)]
    met = missed = 0
    for row in table[2:]:
        cells = [c.strip().lower() for c in row.strip("|").split("|")]
        for k in cols:
            cell = cells[k] if k < len(cells) else ""
            if re.search(r"\b(no|not met)\b", cell):
                missed += 1
            elif re.search(r"\b(yes|met)\b", cell):
                met += 1
    return met, missed


def summarize(name: str, body: str) -> str:
    """The report's entry for a benchmark's write-up: one line with its title, the date of the
    run, how many of its goal rows are met, and a link to the write-up (which has the method,
    the machine and every number), so the report reads in two minutes."""
    lines = body.strip().splitlines()
    date = title = ""
    for line in lines:
        if line.startswith("- Date: ") and not date:
            date = line.removeprefix("- Date: ")
        elif line.startswith("Measured ") and not line.startswith("Measured on") and not date:
            date = line.removeprefix("Measured ").split(" on ")[0].rstrip(".")
        elif line.startswith("## ") and not title:
            title = line.removeprefix("## ")
    tables: list[list[str]] = []
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if i == 0 or not lines[i - 1].startswith("|"):
                tables.append([])
            tables[-1].append(line)
    met = missed = 0
    for table in tables:
        if len(table) > 2 and re.search(r"\b(goal|met)\b", table[0], re.IGNORECASE):
            m, n = _goal_counts(table)
            met, missed = met + m, missed + n
    goals = f": goals met {met} of {met + missed}" if met + missed else ""
    when = f", {date}" if date else ""
    link = f"benchmarks/results/{name}.md"
    return f"- {title or name}{when}{goals}. [Write-up](../{link})."


def write_section(name: str, body: str, path: Path = PERFORMANCE_MD) -> None:
    """Write ``body`` (the full write-up) to ``benchmarks/results/NAME.md`` and its
    summary (:func:`summarize`) between ``name``'s markers in ``path``, creating the file (with its
    heading) or appending the section if needed; the rest of the file is left intact."""
    if path == PERFORMANCE_MD:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"{name}.md").write_text(body.strip() + "\n", encoding="utf-8")
        body = summarize(name, body)
    start, end = _markers(name)
    section = f"{start}\n{body.strip()}\n{end}"
    if path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = FILE_HEADER
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i >= 0 and j >= 0:
        text = text[:i] + section + text[j + len(end) :]
    elif i >= 0 or text.find(end) >= 0:
        raise ValueError(f"{path}: unbalanced {name} markers; fix the file by hand")
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# --- shared formatting and profiling helpers ----------------------------------------------------

ProfileKey = tuple[str, int, str]  # pstats: (file, line, function)


def function_matcher(name: str, file_suffix: str = "") -> Callable[[ProfileKey], bool]:
    """Match a profiled Python function by name and the end of its file path."""
    return lambda k: k[2] == name and k[0].endswith(file_suffix)


def builtin_matcher(fragment: str) -> Callable[[ProfileKey], bool]:
    """Match a profiled built-in (C) function whose description contains ``fragment``."""
    return lambda k: k[0] == "~" and fragment in k[2]


def pg_conninfo(url: str) -> str:
    """The benchmark's PostgreSQL URL without a schema (each run makes its own)."""
    from affidavit.store import postgres_conninfo

    conninfo, schema = postgres_conninfo(url)
    if schema is not None:
        raise SystemExit("error: --pg-url must not carry ?schema=; the benchmark makes its own")
    return conninfo


def spread(runs: Sequence[float], fmt: str = ",.0f") -> str:
    """``median (min–max)`` of repetitions, or the single value."""
    if len(runs) == 1:
        return format(runs[0], fmt)
    return f"{median(runs):{fmt}} ({min(runs):{fmt}}–{max(runs):{fmt}})"


def yes_no(met: bool) -> str:
    return "yes" if met else "**no**"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def steal_text(steal: float | None) -> str:
    if steal is None:
        return "CPU steal time unknown"
    return f"CPU steal (time taken by the hypervisor) during the run: {steal:.0%}"


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def redact(url: str) -> str:
    """``url`` with its password (if any) hidden, for messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def pg_server_version(url: str) -> str:
    """The PostgreSQL server's version, or exit with a clear message if it cannot be reached."""
    import psycopg

    try:
        with psycopg.connect(pg_conninfo(url), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        raise SystemExit(
            f"error: PostgreSQL is unreachable at {redact(url)}: {str(exc).strip()}\n"
            "Start the server or pass --pg-url; to benchmark SQLite only, use --backend sqlite."
        ) from exc
    return str(row[0]) if row else "unknown"


@contextmanager
def pg_fresh_schema(url: str, prefix: str) -> Iterator[str]:
    """``url`` in a fresh schema (``prefix`` + random), dropped afterwards."""
    import psycopg
    from psycopg import sql

    conninfo = pg_conninfo(url)
    schema = f"{prefix}_{secrets.token_hex(4)}"
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}schema={schema}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def pg_fresh_database(url: str, prefix: str) -> Iterator[str]:
    """A fresh database on ``url``'s server (``prefix`` + random), dropped afterwards: for a
    baseline (DBOS) that keeps its tables in a database of its own."""
    import psycopg
    from psycopg import sql

    conninfo = pg_conninfo(url)
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = url.split("?")[0].rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
