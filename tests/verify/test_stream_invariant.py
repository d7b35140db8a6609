"""Stream values of a runtime job, tampered with, on both backends: an edited value breaks the
stored chain; a forger who re-chains and re-seals the log (holding the key) is caught by the
invariant ``stream`` — a value repeated, too large, past the job's limit, with an odd field,
or emitted by a step after it completed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from affidavit import Runtime, ToolRegistry, verify_job
from affidavit.core.canonical import canonical, parse
from affidavit.core.ids import new_event_id
from affidavit.core.streams import MAX_VALUE_BYTES
from affidavit.record._sealing import Sealer
from tests.runtime.test_streams import REFUSED, send, st_agent, st_capped, words
from tests.verify.helpers import RawDb

Log = list[tuple[str, str, Any]]


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    REFUSED.clear()
    tools = ToolRegistry([send, words, st_agent, st_capped])
    with Runtime(store_url, tools=tools, lease_seconds=30) as runtime:
        yield runtime


def run_agent(rt: Runtime, name: str = "st_agent") -> str:
    job = rt.submit(name, {"text": "a b"} if name == "st_agent" else {})
    assert rt.run_job(job.job_id).status == "completed"
    assert verify_job(rt.store, job.job_id).ok
    return job.job_id


def resealed(rt: Runtime, raw: RawDb, job_id: str, edit: Callable[[Log], None]) -> None:
    """``edit`` the decoded log, re-chain it and seal it again with the runtime's own key."""
    events = [(e, t, parse(p)) for _, e, t, p, _ in raw.events(job_id)]
    edit(events)
    raw.rewrite_log(job_id, [(e, t, canonical(p)) for e, t, p in events])
    raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    version, _, _, _, root = raw.events(job_id)[-1]
    seal = Sealer.for_store(rt.store).key().seal(job_id, version, root)
    with rt.store.transaction() as tx:
        tx.seal_insert(seal)


def values(events: Log) -> list[int]:
    return [i for i, (_, t, _) in enumerate(events) if t == "stream_emitted"]


def repeated(events: Log) -> None:
    i = values(events)[0]
    events.insert(i + 1, (new_event_id(), "stream_emitted", dict(events[i][2])))


def renumbered(events: Log) -> None:
    for i in values(events):
        events[i][2]["seq"] += 1


def too_large(events: Log) -> None:
    events[values(events)[0]][2]["value"] = "x" * MAX_VALUE_BYTES


def odd_field(events: Log) -> None:
    events[values(events)[0]][2]["note"] = "added"


def after_its_step(events: Log) -> None:
    """The word step's value moved after the step's node_finished."""
    i = values(events)[1]
    moved = events.pop(i)
    finished = next(
        j
        for j, (_, t, p) in enumerate(events)
        if t == "node_finished" and p["node_id"] == moved[2]["node_id"]
    )
    events.insert(finished + 1, moved)
    for seq, j in enumerate(values(events)):
        events[j][2]["seq"] = seq


def no_such_step(events: Log) -> None:
    events[values(events)[1]][2]["node_id"] = "#9"


def zero_attempt(events: Log) -> None:
    events[values(events)[1]][2]["attempt"] = 0


CASES: list[tuple[Callable[[Log], None], str]] = [
    (repeated, "stream"),
    (renumbered, "stream"),
    (too_large, "stream"),
    (odd_field, "stream"),
    (after_its_step, "stream"),
    (no_such_step, "node_in_plan"),
    (zero_attempt, "stream"),
]


def test_an_edited_value_breaks_the_chain(rt: Runtime, store_url: str) -> None:
    raw = RawDb(store_url)
    job_id = run_agent(rt)
    version = next(v for v, _, t, _, _ in raw.events(job_id) if t == "stream_emitted")
    payload = raw.events(job_id)[version - 1][3].replace(b'"start"', b'"START"')
    raw.set_payload(job_id, version, payload)
    result = verify_job(rt.store, job_id)
    assert not result.ok and result.stored_chain.first_bad_version == version


@pytest.mark.parametrize("case", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_resealed_forgery_fails_the_stream_invariant(
    rt: Runtime, store_url: str, case: tuple[Callable[[Log], None], str]
) -> None:
    edit, invariant = case
    raw = RawDb(store_url)
    job_id = run_agent(rt)
    resealed(rt, raw, job_id, edit)
    result = verify_job(rt.store, job_id)
    assert result.seal.ok and result.stored_chain.ok
    assert not result.ok
    assert result.replay_proof_result.invariant == invariant, result.replay_proof_result.error


def test_past_the_recorded_limit(rt: Runtime, store_url: str) -> None:
    raw = RawDb(store_url)
    job_id = run_agent(rt, "st_capped")  # 3 values, its limit

    def one_more(events: Log) -> None:
        last = values(events)[-1]
        extra = {**events[last][2], "seq": 3, "value": 3}
        events.insert(last + 1, (new_event_id(), "stream_emitted", extra))

    resealed(rt, raw, job_id, one_more)
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "stream"
    assert "limit" in (result.replay_proof_result.error or "")
