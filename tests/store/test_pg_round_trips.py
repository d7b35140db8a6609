"""Round trips of the PostgreSQL store's write transactions (psycopg pipeline mode): each
synchronization point of the pipeline is one round trip to the server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from affidavit.core.canonical import canonical
from affidavit.core.ids import new_attempt_id, new_event_ids
from affidavit.store import NewEvent, Store, open_store
from tests.conftest import PG_URL, with_schema


@pytest.fixture
def pg_store(pg_schema: str) -> Iterator[Store]:
    store = open_store(with_schema(PG_URL, pg_schema))
    yield store
    store.close()


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pipeline's synchronizations (the real ones still happen)."""
    count = [0]
    real = psycopg.Pipeline.sync

    def sync(self: psycopg.Pipeline) -> None:
        count[0] += 1
        real(self)

    monkeypatch.setattr(psycopg.Pipeline, "sync", sync)
    return count


def _encoded(n: int) -> list[tuple[str, str, bytes]]:
    return [(i, "node_started", canonical({"n": k})) for k, i in enumerate(new_event_ids(n))]


def test_t1_costs_the_round_trips_of_its_append_alone(pg_store: Store, syncs: list[int]) -> None:
    """A tool step's T1 — the ledger insert only one attempt can win, then the started events
    — costs no round trip more than the append alone: the insert travels with the append's
    lock and head read."""
    job, _ = pg_store.create_job(events=[NewEvent("job_created", {})])
    job_id, attempt = job.job_id, new_attempt_id()
    with pg_store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="w", expires_at=1.0)
    head = bytes.fromhex(pg_store.list_events(job_id)[-1].chain_hash)

    def counted(body: Callable[[Any], list[Any]]) -> tuple[int, list[Any]]:
        before = syncs[0]
        with pg_store.transaction() as tx:
            stored = body(tx)
        return syncs[0] - before, stored

    def append_alone(tx: Any) -> list[Any]:
        return list(
            tx.append_encoded(job_id, _encoded(2), expected_version=1, head=head, fence=attempt)
        )

    alone, stored = counted(append_alone)
    head = bytes.fromhex(stored[-1].chain_hash)

    def t1(tx: Any) -> list[Any]:
        won = tx.ledger_insert(
            job_id=job_id,
            key="k",
            node_id="n",
            step_id="s",
            tool_name="t",
            args_hash="a",
            invocation_id="i",
            attempt_id=attempt,
        )
        assert won is True
        return list(
            tx.append_encoded(job_id, _encoded(2), expected_version=3, head=head, fence=attempt)
        )

    with_insert, stored = counted(t1)
    assert [e.version for e in stored] == [4, 5]
    assert alone >= 1
    assert with_insert == alone
