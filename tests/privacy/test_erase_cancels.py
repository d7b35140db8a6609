"""An erasure cancels the subject's unfinished jobs first, by the cancel's rules: a job with
nothing in flight ends cancelled and the erasure goes on; one with a tool call in flight is
refused until the call has finished and its real outcome is recorded — never a job left
running on values whose key is gone, never a call recorded as lost that happened."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.core.privacy import SubjectBusy
from affidavit.privacy import erase, find_subject
from affidavit.runtime import erasure_cancel
from affidavit.verify import verify_job
from tests.cli.test_cli import cli_process, json_of
from tests.privacy import subject_tools as st


@pytest.fixture
def held() -> Iterator[None]:
    st.ENTERED.clear()
    st.GATE.clear()
    yield
    st.GATE.set()


def erase_cancelling(rt: Runtime, subject: str) -> object:
    cancel = erasure_cancel(rt.store, by="ops", sealer=rt.sealer)
    return erase(rt.store, subject, sealer=rt.sealer, reason="asked", cancel=cancel)


def test_a_waiting_job_is_cancelled_first_and_the_erasure_goes_on(rt: Runtime) -> None:
    job = rt.submit("pv_everything", {"email": st.CANARY}, subject="customer-7")
    assert rt.run_job(job.job_id).status == "waiting"
    done = erase_cancelling(rt, "customer-7")
    assert done.erased_now and done.cancelled == [job.job_id]  # type: ignore[attr-defined]
    assert done.receipt["receipt"]["job_ids"] == [job.job_id]  # type: ignore[attr-defined]
    assert rt.store.get_job(job.job_id).status == "cancelled"
    cancelled = [e for e in rt.store.list_events(job.job_id) if e.type == "job_cancelled"]
    assert cancelled and cancelled[0].payload["reason"] == "its data subject is being erased"
    assert verify_job(rt.store, job.job_id).ok


def test_without_a_cancel_an_unfinished_job_refuses_and_nothing_changes(rt: Runtime) -> None:
    job = rt.submit("pv_everything", {"email": st.CANARY}, subject="customer-7")
    assert rt.run_job(job.job_id).status == "waiting"
    with pytest.raises(SubjectBusy, match="not finished"):
        erase(rt.store, "customer-7", sealer=rt.sealer)
    assert rt.store.get_job(job.job_id).status == "waiting"
    assert find_subject(rt.store, "customer-7").erased_at is None


def test_a_call_in_flight_finishes_and_is_recorded_before_the_erasure(
    rt: Runtime, held: None
) -> None:
    job = rt.submit("pv_slow_agent", {"email": st.CANARY}, subject="customer-8")
    run = threading.Thread(target=rt.run_job, args=(job.job_id,))
    run.start()
    try:
        assert st.ENTERED.wait(30)
        with pytest.raises(SubjectBusy, match="cancel is requested"):
            erase_cancelling(rt, "customer-8")
        assert find_subject(rt.store, "customer-8").erased_at is None
        assert rt.store.job_key(job.job_id)[1] is not None  # type: ignore[index]
    finally:
        st.GATE.set()
        run.join(60)
    assert rt.store.get_job(job.job_id).status == "cancelled"
    (finished,) = [
        e for e in rt.store.list_events(job.job_id) if e.type == "tool_invocation_finished"
    ]
    assert finished.payload["outcome"] == "success"  # the call happened and the record says so
    done = erase_cancelling(rt, "customer-8")
    assert done.erased_now and done.cancelled == []  # type: ignore[attr-defined]
    assert verify_job(rt.store, job.job_id).ok
    assert rt.store.get_job(job.job_id).status == "cancelled"


def test_the_command_line_cancels_first_or_says_busy(
    rt: Runtime, store_url: str, master_key: Path, held: None
) -> None:
    env = {"AFFIDAVIT_MASTER_KEY": str(master_key)}
    waiting = rt.submit("pv_everything", {"email": st.CANARY}, subject="c-20")
    assert rt.run_job(waiting.job_id).status == "waiting"
    ok = cli_process("erase", "--subject", "c-20", "--db", store_url, "--json", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json_of(ok)["cancelled"] == [waiting.job_id]
    slow = rt.submit("pv_slow_agent", {"email": st.CANARY}, subject="c-21")
    run = threading.Thread(target=rt.run_job, args=(slow.job_id,))
    run.start()
    try:
        assert st.ENTERED.wait(30)
        busy = cli_process("erase", "--subject", "c-21", "--db", store_url, "--json", env=env)
        assert busy.returncode == 3, busy.stdout + busy.stderr
        assert json_of(busy)["error"]["code"] == "subject_busy"
    finally:
        st.GATE.set()
        run.join(60)
    again = cli_process("erase", "--subject", "c-21", "--db", store_url, env=env)
    assert again.returncode == 0 and "erased" in again.stdout, again.stdout + again.stderr
