"""A page of a job listing costs what the page holds, not what the table holds.

Measured without clocks: on SQLite the virtual-machine instructions the statement runs (a
progress handler called every few instructions), on PostgreSQL the rows its plan's scans read
(``EXPLAIN ANALYZE`` of the statement the store issued, after ``ANALYZE``, with sequential and
bitmap scans off so that the test checks what an index *can* serve on a small table).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql

from affidavit.store import JobFilter, NewEvent, Store
from affidavit.store.postgres import split_url
from tests.store.plans import rows_read, spied, sqlite_steps

LIMIT = 5


def add_jobs(store: Store, count: int) -> None:
    """``count`` completed jobs of one event each, in namespaces ``a`` and ``b`` (one
    transaction)."""
    with store.transaction(durable=False) as tx:
        for i in range(count):
            job, _ = tx.create_job(namespace="ab"[i % 2], status="completed")
            tx.append(job.job_id, [NewEvent("job_submitted", {"i": i})], expected_version=0)


def _postgres_cost(store: Any, call: Callable[[], object]) -> int:
    statements: list[tuple[str, Any]] = []
    with spied(store, "_reader", lambda _cur, query, params: statements.append((query, params))):
        call()
    [(query, params)] = statements
    conninfo, schema = split_url(store.url)
    with psycopg.connect(conninfo) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema or "public")))
        conn.execute("ANALYZE jobs, events")  # (a fresh table has no statistics yet)
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        [(doc,)] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params).fetchall()
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    return rows_read(plan)


def cost(store: Store, call: Callable[[], object]) -> int:
    measure = sqlite_steps if store.backend == "sqlite" else _postgres_cost
    return measure(store, call)


def test_a_first_page_costs_the_same_whatever_the_number_of_jobs(store: Store) -> None:
    pages = {
        "all": JobFilter(limit=LIMIT),
        "status": JobFilter(status=["completed"], limit=LIMIT),
        "namespace": JobFilter(namespace="a", limit=LIMIT),
    }
    add_jobs(store, 100)
    small = {name: cost(store, lambda f=f: store.list_jobs(f)) for name, f in pages.items()}
    add_jobs(store, 700)
    large = {name: cost(store, lambda f=f: store.list_jobs(f)) for name, f in pages.items()}
    for name in pages:
        # 8 times the jobs: a sort of the matching jobs would cost several times more
        assert large[name] <= 1.5 * small[name] + 10, (name, small[name], large[name])
    listed = store.list_jobs(pages["namespace"])
    assert len(listed) == LIMIT and {j.namespace for j in listed} == {"a"}
    assert all(j.version == 1 for j in listed)


def test_a_deep_page_skips_jobs_without_reading_their_logs(store: Store) -> None:
    """An offset of 750 skips 750 index entries; before, it read each skipped job's chain
    head (its last event) first."""
    add_jobs(store, 800)
    first = cost(store, lambda: store.list_jobs(JobFilter(limit=LIMIT)))
    deep = cost(store, lambda: store.list_jobs(JobFilter(limit=LIMIT, offset=750)))
    per_skipped = (deep - first) / 750
    # measured: SQLite about 7 progress calls per skipped job when it joins the head, 0.2
    # when it steps over an index entry; PostgreSQL about 4 rows read per skipped job with
    # the join, 1 without
    assert per_skipped < (1.0 if store.backend == "sqlite" else 1.5), (first, deep)
    page = store.list_jobs(JobFilter(limit=LIMIT, offset=750))
    everything = store.list_jobs(JobFilter(limit=800))
    assert [j.job_id for j in page] == [j.job_id for j in everything[750:755]]
    assert [j.version for j in page] == [1] * LIMIT


def test_a_page_after_a_cursor_costs_what_a_first_page_costs(store: Store) -> None:
    """``before=`` (the keyset cursor) starts the scan at the cursor's index entry, whatever its
    depth: no entry before it is read, unlike an offset."""
    add_jobs(store, 800)
    everything = store.list_jobs(JobFilter(limit=800))
    cursor = everything[749].job_id
    for filters in (JobFilter(limit=LIMIT), JobFilter(status=["completed"], limit=LIMIT)):
        first = cost(store, lambda f=filters: store.list_jobs(f))
        deep = cost(store, lambda f=filters: store.list_jobs(replace(f, before=cursor)))
        offset = cost(store, lambda f=filters: store.list_jobs(replace(f, offset=750)))
        # measured: SQLite ~43 progress calls for the first page, ~50 after the cursor (its
        # own look-up included), ~190 with the offset (~950 for a cursor that is no index
        # range); PostgreSQL 20, 21 and 770 rows read (771 for the cursor that is no range)
        assert deep <= 2 * first + 10, (filters, first, deep, offset)
        assert 2 * deep < offset, (filters, first, deep, offset)
        page = store.list_jobs(replace(filters, before=cursor))
        assert [j.job_id for j in page] == [j.job_id for j in everything[750:755]]
