"""Tables longer than Rich can lay out quickly: plain aligned columns, streamed for event logs
(both backends, the CLI in a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.cli import output
from affidavit.examples import refund
from affidavit.store import open_store
from tests.cli.test_cli import cli, cli_env, json_of

NODES = output.RICH_TABLE_ROWS + 1  # one more than a Rich table holds
ORDER = {"order": {"damaged": True, "total": 10}}


def long_job(url: str) -> str:
    """A completed job of NODES pure steps: 2 * NODES + 3 events."""
    plan = {
        "nodes": [
            {"id": f"p{i:04d}", "type": "pure", "tool": "decide_refund", "args": ORDER}
            for i in range(NODES)
        ]
    }
    with Runtime(url, tools=refund.TOOLS) as rt:
        job = rt.run_job(rt.submit(plan, {}).job_id)
    assert job.status == "completed"
    return job.job_id


def plain_rows(stdout: str) -> list[list[str]]:
    """The rows of plain columns (the header and its rule dropped), split on runs of spaces."""
    lines = stdout.splitlines()
    assert lines[1].startswith("--"), lines[:2]
    return [line.split(None, 4) for line in lines[2:]]


def test_a_long_event_log_is_streamed_as_plain_columns(store_url: str) -> None:
    job_id = long_job(store_url)
    store = open_store(store_url)
    try:
        stored = store.list_events(job_id)
    finally:
        store.close()
    total = len(stored)
    assert total == 2 * NODES + 3

    whole = cli("jobs", "events", job_id, "--db", store_url)
    assert whole.returncode == 0, whole.stderr
    assert "┃" not in whole.stdout  # not a Rich table
    rows = plain_rows(whole.stdout)
    assert [int(r[0]) for r in rows] == list(range(1, total + 1))
    assert [r[1] for r in rows] == [e.type for e in stored]
    assert [r[2] for r in rows] == [e.event_id for e in stored]
    assert [r[3] for r in rows] == [e.chain_hash[:16] + "…" for e in stored]
    texts = [e.payload_bytes.decode() for e in stored]
    assert [r[4] for r in rows] == [t if len(t) <= 80 else t[:79] + "…" for t in texts]

    # pages of 1,000 rows: a window across page boundaries comes out whole and in order
    window = cli(
        "jobs", "events", job_id, "--after-version", "150", "--limit", "1400", "--db", store_url
    )
    assert window.returncode == 0, window.stderr
    assert [int(r[0]) for r in plain_rows(window.stdout)] == list(range(151, 1551))

    # few enough rows: the Rich table, as before
    for args in (("--limit", "5"), ("--after-version", str(total - 5))):
        short = cli("jobs", "events", job_id, *args, "--db", store_url)
        assert short.returncode == 0 and "┃" in short.stdout, short.stdout

    # --json is unchanged: every event
    assert len(json_of(cli("jobs", "events", job_id, "--db", store_url, "--json"))) == total


def test_a_long_trace_and_job_list_are_plain_columns(store_url: str) -> None:
    job_id = long_job(store_url)
    trace = cli("jobs", "trace", job_id, "--db", store_url)
    assert trace.returncode == 0, trace.stderr
    lines = trace.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id}: completed")
    assert lines[1].split() == [
        "node",
        "type",
        "state",
        "attempts",
        "duration",
        "ms",
        "depends",
        "on",
    ]
    nodes = [line.split()[:4] for line in lines[3:]]
    assert nodes == [[f"p{i:04d}", "pure", "pure", "1"] for i in range(NODES)]

    store = open_store(store_url)
    try:
        for _ in range(NODES - 1):
            store.create_job(plan_name="p[bold]x")
    finally:
        store.close()
    listed = cli("jobs", "list", "--limit", str(NODES + 5), "--db", store_url)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[2:]
    assert len(rows) == NODES and "┃" not in listed.stdout
    assert rows[0].split()[2] == "p[bold]x"  # stored text, not markup
    assert rows[-1].split()[0] == job_id  # oldest last


def test_a_reader_closing_stdout_early_is_exit_141(store_url: str) -> None:
    """`affidavit jobs events J | head -1`: exit 141 as a program stopped by SIGPIPE, no
    traceback — not 1, which says that something failed."""
    job_id = long_job(store_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "jobs", "events", job_id, "--db", store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().split()[:2] == [b"v", b"type"]
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


@pytest.mark.parametrize(
    ("cells", "shown"),
    [
        (["a", "[bold]b[/]"], "a   [bold]b[/]"),  # never markup
        (["x\x1b[31m", "y\nz"], "x?[31m  y?z"),  # control characters as ?
        (["日本", "w"], "日本  w"),  # widths in terminal cells
        (["日…", "w"], "日…  w"),
        (["abc…", "w"], "abc…  w"),
        (["", "w"], "    w"),
    ],
)
def test_plain_columns_print_text_as_it_is(
    capsys: pytest.CaptureFixture[str], cells: list[str], shown: str
) -> None:
    output.plain_table(["h1", "h2"], [cells])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == shown, lines


def test_plain_columns_stream_rows_as_they_come(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Any] = []

    def rows() -> Any:
        for i in range(3):
            seen.append(capsys.readouterr().out.count("\n"))  # lines printed before this row
            yield (str(i), "x")

    output.plain_columns(["n", "v"], [1], rows())
    assert seen == [2, 1, 1]  # the header and rule, then one line per row already out
