"""What the retention tests share: finished, sealed jobs whose seals are in the log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.store import Store
from affidavit.tlog import LogKey, Sequencer, default_log_key_path
from tests.runtime.helpers import node, plan

# well past any job these tests finish: retention's clock, so "older than 1 day" holds for them
LATER = time.time() + 10 * 86_400


def tools() -> ToolRegistry:
    def echo(ctx: ToolContext, x: int) -> dict[str, int]:
        return {"x": x}

    return ToolRegistry((Tool("echo", echo, "tool"),))


def one_step(x: int = 1) -> dict[str, Any]:
    return plan(node("a", "echo", args={"x": x}))


def waiting_plan() -> dict[str, Any]:
    return plan({"id": "w", "type": "wait"})


def finished_jobs(url: str, count: int, **submit: Any) -> list[str]:
    """``count`` completed jobs of one tool step each, sealed, their seals in the log."""
    with Runtime(url, tools=tools()) as rt:
        ids = [rt.submit(one_step(n), {}, **submit).job_id for n in range(count)]
        rt.run_until_idle()
        assert {rt.get_job(j).status for j in ids} == {"completed"}
        integrate(rt.store)
    return ids


def integrate(store: Store) -> None:
    """Put every queued seal into the transparency log."""
    Sequencer(store, LogKey(default_log_key_path(store.url))).integrate()


def removed_rows(store: Store, job_id: str) -> dict[str, int]:
    """How many rows of ``job_id`` each live table still holds."""
    counts = {}
    with store.transaction(durable=False) as tx:
        for table, column in (
            ("jobs", "job_id"),
            ("events", "job_id"),
            ("tool_invocations", "job_id"),
            ("job_tags", "job_id"),
            ("seals", "job_id"),
            ("tlog_leaves", "job_id"),
            ("archived_jobs", "job_id"),
        ):
            counts[table] = int(
                tx.query(f"SELECT count(*) FROM {table} WHERE {column} = ?", (job_id,))[0][0]
            )
    return counts


LIVE_TABLES = ("jobs", "events", "tool_invocations", "job_tags")


def live_size(url: str) -> int:
    """The bytes the live store takes once compacted: the SQLite file after ``VACUUM`` (its
    WAL checkpointed), or on PostgreSQL the total size of the job tables (with their indexes
    and TOAST) after ``VACUUM FULL``."""
    import psycopg
    from psycopg import sql

    from affidavit.store import connect_raw
    from affidavit.store.postgres import split_url

    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        conn = connect_raw(path, autocommit=True)
        try:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return Path(path).stat().st_size
    conninfo, schema = split_url(url)
    with psycopg.connect(conninfo, autocommit=True) as pg:
        if schema:
            pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        total = 0
        for table in LIVE_TABLES:
            pg.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(table)))
            row = pg.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
            assert row is not None
            total += int(row[0])
        return total
