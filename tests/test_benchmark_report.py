"""The report's entry for a benchmark (benchmarks/_report.py): one line with the run's date and
its goal rows counted from the write-up's tables."""

from __future__ import annotations

from benchmarks._report import summarize

WRITE_UP = """## Proof packs (`benchmarks/bench_packs.py`)

Measured on:

- Date: 2026-12-03 18:43 UTC
- CPU: a CPU

| what | time |
| --- | ---: |
| ours | 1.0 s |

| goal | measured | met |
| --- | ---: | --- |
| a ≥ 3× | 6.0× | yes |
| b within 4× | 4.9× | **no** |
| c ≥ 6× | 5.2× | NOT met |
| d | 1.0× | — |
"""


def test_an_entry_counts_the_goal_rows_met_and_links_the_write_up() -> None:
    assert summarize("bench_packs", WRITE_UP) == (
        "- Proof packs (`benchmarks/bench_packs.py`), 2026-12-03 18:43 UTC: goals met 1 of 3. "
        "[Write-up](../benchmarks/results/bench_packs.md)."
    )


def test_a_goal_column_saying_met_inline_is_counted() -> None:
    body = (
        "## bench_children\n\nMeasured 2026-12-03 18:35 UTC on a CPU.\n\n"
        "| backend | ms | goal |\n| --- | ---: | --- |\n"
        "| sqlite | 271 | ≥ 3×: met |\n| postgresql | 514 | ≥ 3×: NOT met |\n"
    )
    assert summarize("bench_children", body) == (
        "- bench_children, 2026-12-03 18:35 UTC: goals met 1 of 2. "
        "[Write-up](../benchmarks/results/bench_children.md)."
    )


def test_a_write_up_without_a_goal_table_says_no_count() -> None:
    body = "## Transparency log\n\n| what | n |\n| --- | ---: |\n| leaves/s | 9 |\n"
    assert summarize("bench_log", body) == (
        "- Transparency log. [Write-up](../benchmarks/results/bench_log.md)."
    )
