"""docs/formats.md §10 through verify_job: the store's rows give the published root and hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from affidavit import verify_job
from affidavit.store import NewEvent, Store

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "formats_v1.json").read_text()
)


def test_vector_chain_and_execution_hash_from_the_store(store: Store) -> None:
    events = [NewEvent(t, p, event_id=e) for e, t, p in VECTORS["chain"]["events"]]
    job, _ = store.create_job(events=events)
    result = verify_job(store, job.job_id)
    assert result.event_chain_root_hash == VECTORS["chain"]["root"]
    assert result.stored_chain.to_dict() == {
        "ok": True,
        "first_bad_version": None,
        "event_count": 3,
    }
    # The minimal payloads are no real job: the replay proof says so, naming the plan.
    assert result.replay_proof_result.invariant == "plan"

    store.append(
        job.job_id,
        [NewEvent("node_finished", {"node_id": "decide", "result_type": "pure"}, event_id="e4")],
        expected_version=3,
    )
    result = verify_job(store, job.job_id)
    assert result.execution_hash == VECTORS["execution_hash"]["expected"]
    assert result.stored_chain.ok and result.stored_chain.event_count == 4
