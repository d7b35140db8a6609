"""A subject's job has every value a person or an agent supplies sealed before it reaches the
store; the run reads them opened; the chain, seal and every proof are over the envelopes."""

from __future__ import annotations

from affidavit import Runtime
from affidavit.core.privacy import is_sealed
from affidavit.verify import verify_job
from tests.privacy import subject_tools as st
from tests.privacy.conftest import run_everything


def _raw(rt: Runtime, job_id: str) -> bytes:
    return b"".join(e.payload_bytes for e in rt.store.list_events(job_id))


def test_every_payload_kind_is_sealed_and_the_job_runs_as_without(rt: Runtime) -> None:
    job_id = run_everything(rt)
    events = rt.store.list_events(job_id)
    assert st.CANARY.encode() not in _raw(rt, job_id)
    job = rt.store.get_job(job_id)
    assert is_sealed(job.output)
    by_type = {e.type: e.payload for e in events}
    assert is_sealed(by_type["job_created"]["input"])
    assert is_sealed(by_type["step_called"]["args"])
    assert is_sealed(by_type["tool_invocation_finished"]["result"])
    assert is_sealed(by_type["stream_emitted"]["value"])
    assert is_sealed(by_type["job_completed"]["output"])
    answered = [e.payload for e in events if e.type == "wait_completed"]
    assert is_sealed(answered[0]["payload"])
    assert answered[1]["payload"]["approved"] is True  # (the verifier checks it)
    assert is_sealed(answered[1]["payload"]["comment"])
    with rt.store.transaction() as tx:
        rows = tx.ledger_list(job_id)
    assert rows and all(is_sealed(row.result) for row in rows)
    result = verify_job(rt.store, job_id)
    assert result.ok, result


def test_the_same_job_without_a_subject_is_stored_in_the_clear(rt: Runtime) -> None:
    job_id = run_everything(rt, subject=None)
    assert st.CANARY.encode() in _raw(rt, job_id)
    assert verify_job(rt.store, job_id).ok


def test_errors_are_sealed(rt: Runtime) -> None:
    for name in ("pv_tool_error", "pv_agent_error"):
        job = rt.submit(name, {"email": st.CANARY}, subject="customer-7")
        done = rt.run_job(job.job_id)
        assert done.status == "failed"
        assert st.CANARY.encode() not in _raw(rt, job.job_id), name
        assert is_sealed(rt.store.get_job(job.job_id).error)
        assert verify_job(rt.store, job.job_id).ok, name


def test_a_subject_job_starts_no_child_and_is_not_forked(rt: Runtime) -> None:
    import pytest

    from affidavit.core.errors import AffidavitError

    job = rt.submit("pv_parent", {"email": st.CANARY}, subject="customer-7")
    done = rt.run_job(job.job_id)
    assert done.status == "failed"
    assert st.CANARY.encode() not in _raw(rt, job.job_id)
    assert [j.job_id for j in rt.store.list_jobs()] == [job.job_id]  # no child was created
    simple = rt.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")
    rt.run_job(simple.job_id)
    with pytest.raises(AffidavitError, match="has a subject"):
        rt.fork(simple.job_id, "#0")


def test_a_copy_made_before_migration_24_is_read_as_it_is(store_url: str) -> None:
    """A store opened read-only reads a database without the subject tables: no job there
    has a subject."""
    from affidavit.store import open_store
    from tests.store.legacy import undo_migration_24

    with Runtime(store_url, tools=st.registry()) as runtime:
        job = runtime.submit("pv_simple", {"email": "x"})
        runtime.run_job(job.job_id)
    undo_migration_24(store_url)
    store = open_store(store_url, read_only=True)
    try:
        assert store.job_key(job.job_id) is None and store.list_subjects() == []
        assert verify_job(store, job.job_id).ok
    finally:
        store.close()
