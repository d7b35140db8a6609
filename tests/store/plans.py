"""What a statement costs, measured without clocks: SQLite's virtual-machine instructions, the
rows PostgreSQL's plan reads; and a spy on the cursors a store reads through."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def sqlite_steps(store: Any, call: Callable[[], object]) -> int:
    """SQLite virtual-machine instructions (every 10th: a progress handler) that ``call`` runs
    on this thread's reader connection."""
    with store._reader() as cur:  # this thread's reader connection, which reads use
        conn = cur.connection
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        call()
    finally:
        conn.set_progress_handler(None, 0)
    return steps


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a PostgreSQL plan (``EXPLAIN (FORMAT JSON)``)."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


def rows_read(plan: dict[str, Any]) -> int:
    """Rows every scan of an ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan produced or filtered out,
    over all its loops."""
    return sum(
        round((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"])
        for n in plan_nodes(plan)
        if "Scan" in n["Node Type"]
    )


@contextmanager
def spied(store: Any, reader: str, before: Callable[[Any, str, Any], None]) -> Iterator[None]:
    """While it lasts, every statement run on a cursor of ``store.<reader>()`` is first shown
    to ``before(cursor, query, params)``."""
    original = getattr(store, reader)

    @contextmanager
    def spying_reader() -> Iterator[Any]:
        with original() as cur:

            class Spy:
                def execute(self, query: str, params: Any = None) -> Any:
                    before(cur, query, params)
                    return cur.execute(query, params)

                def __getattr__(self, name: str) -> Any:
                    return getattr(cur, name)

            yield Spy()

    setattr(store, reader, spying_reader)
    try:
        yield
    finally:
        delattr(store, reader)
