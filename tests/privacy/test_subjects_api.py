"""Subjects over HTTP and in the Python client: ``GET /api/subjects``, ``GET
/api/subjects/{subject}`` and ``POST /api/subjects/{subject}/erase`` against a real ``affidavit
serve`` process on loopback, on both backends; the receipt the API answers verifies with the
real ``affidavit erase verify`` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import anyio
import httpx
import pytest

from affidavit import AsyncClient, Client, Runtime
from affidavit.api.models import EraseSubject
from affidavit.client import ApiError
from affidavit.core.canonical import canonical
from affidavit.core.privacy import (
    ERASED,
    MAX_SUBJECT,
    SubjectBusy,
    SubjectError,
    SubjectNotFound,
)
from affidavit.faces.auth import Forbidden
from affidavit.privacy._receipt import MAX_REASON
from affidavit.store import open_store
from tests.api.conftest import make_keys
from tests.cli.test_cli import cli_process, json_of
from tests.cli.test_serve_cli import free_port
from tests.privacy import subject_tools as st

TOOLS = str(Path(st.__file__).resolve())
SUBJECT = "customer/7 ünïcode . %2F"  # a `/`, a `%`, a `.`, spaces and non-ASCII in the path


@dataclass
class Served:
    url: str
    db_url: str
    keys: dict[str, str]
    runtime: Runtime

    def client(self, who: str) -> Client:
        return Client(self.url, api_key=self.keys[who].removeprefix("Bearer "))

    def async_client(self, who: str) -> AsyncClient:
        return AsyncClient(self.url, api_key=self.keys[who].removeprefix("Bearer "))


@pytest.fixture
def served(store_url: str, master_key: Path) -> Iterator[Served]:
    """``affidavit serve --tools subject_tools`` with the master key, in a process of its own."""
    store = open_store(store_url)
    keys = make_keys(store)
    store.close()
    port = free_port()
    env = {**os.environ, "AFFIDAVIT_MASTER_KEY": str(master_key)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", str(port), "--db", store_url,
         "--tools", TOOLS, "--rate-limit", "off"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.05)
        with Runtime(store_url, tools=st.registry(), master_key=master_key) as rt:
            yield Served(url, store_url, keys, rt)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def _finished_job(served: Served, subject: str) -> str:
    with served.client("agent_a") as c:
        job = c.submit("pv_simple", {"email": st.CANARY}, subject=subject)
    assert served.runtime.run_job(job.job_id).status == "completed"
    return job.job_id


def test_subjects_are_listed_shown_and_erased_and_the_receipt_verifies(
    served: Served, tmp_path: Path
) -> None:
    first, second = _finished_job(served, SUBJECT), _finished_job(served, SUBJECT)
    with served.client("admin") as admin:
        listed = admin.subjects().subjects
        assert [s.jobs for s in listed] == [2] and listed[0].erased_at is None
        shown = admin.subject(SUBJECT)
        assert shown.job_ids == [first, second] and shown.subject_id == listed[0].subject_id
        raw = httpx.get(
            f"{served.url}/api/subjects", headers={"Authorization": served.keys["admin"]}
        )
        assert SUBJECT not in raw.text and st.CANARY not in raw.text  # never the subject or data
        with served.client("observer_a") as observer:
            assert observer.get(first).output == st.CANARY  # opened while the key exists
        done = admin.erase(SUBJECT, reason="request #12")
        assert done.erased_now and done.receipt.receipt.job_ids == [first, second]
        assert done.receipt.receipt.reason == "request #12"
        receipt = tmp_path / "receipt.json"
        receipt.write_text(json.dumps(done.model_dump(mode="json")["receipt"]))
        keys = json_of(cli_process("keys", "show", "--db", served.db_url, "--json"))
        checked = cli_process(
            "erase", "verify", str(receipt), "--key", keys["public_key"], "--json"
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert json_of(checked)["ok"] and json_of(checked)["job_ids"] == [first, second]
        receipt.write_text(receipt.read_text().replace("request #12", "request #13"))
        forged = cli_process("erase", "verify", str(receipt), "--key", keys["public_key"])
        assert forged.returncode == 1
        again = admin.erase(SUBJECT)
        assert not again.erased_now and again.receipt.receipt == done.receipt.receipt
        assert again.receipt.signature == done.receipt.signature
        # once the log integrated the receipt's leaf, erasing again hands it back with its
        # proof, and the receipt verifies against the log's key too
        for _ in range(50):
            cli_process("log", "integrate", "--db", served.db_url)  # (or the server's did)
            logged = admin.erase(SUBJECT)
            if logged.receipt.tlog_proof is not None:
                break
        assert logged.receipt.tlog_proof is not None
        receipt.write_text(json.dumps(logged.model_dump(mode="json")["receipt"]))
        vkey = json_of(cli_process("log", "key", "--db", served.db_url, "--json"))["vkey"]
        checked = cli_process("erase", "verify", str(receipt), "--key", keys["public_key"],
                              "--log-key", vkey, "--json")  # fmt: skip
        assert checked.returncode == 0 and json_of(checked)["logged"] is True, checked.stdout
        after = admin.subject(SUBJECT)
        assert after.erased_at is not None and after.erase_reason == "request #12"
        with served.client("observer_a") as observer:
            assert observer.get(first).output == ERASED
            assert observer.verify(first).ok and observer.verify(second).ok


def test_erasure_cancels_an_unfinished_job_first(served: Served) -> None:
    with served.client("agent_a") as c:
        waiting = c.submit("pv_everything", {"email": st.CANARY}, subject="c-8")
    assert served.runtime.run_job(waiting.job_id).status == "waiting"
    with served.client("admin") as admin:
        done = admin.erase("c-8", reason="asked")
        assert done.erased_now and done.cancelled == [waiting.job_id]
        assert admin.subject("c-8").erased_at is not None
        job = admin.get(waiting.job_id)
        assert job.status == "cancelled" and admin.verify(waiting.job_id).ok
        events = admin.events(waiting.job_id)
        assert events[0].payload["input"] == ERASED


def test_erasure_is_busy_while_a_call_is_in_flight_and_erases_after(served: Served) -> None:
    st.ENTERED.clear()
    st.GATE.clear()
    with served.client("agent_a") as c:
        slow = c.submit("pv_slow_agent", {"email": st.CANARY}, subject="c-10")
    run = threading.Thread(target=served.runtime.run_job, args=(slow.job_id,))
    run.start()
    try:
        assert st.ENTERED.wait(30)
        with served.client("admin") as admin:
            with pytest.raises(SubjectBusy, match="cancel is requested") as busy:
                admin.erase("c-10")
            assert busy.value.code == "subject_busy" and admin.subject("c-10").erased_at is None
    finally:
        st.GATE.set()
        run.join(60)
    with served.client("admin") as admin:
        assert admin.get(slow.job_id).status == "cancelled"
        done = admin.erase("c-10")
        assert done.erased_now and done.cancelled == []


BAD_ERASURES: list[tuple[str, dict[str, object] | None, type[Exception], int]] = [
    ("nobody", None, SubjectNotFound, 404),
    ("x" * (MAX_SUBJECT + 1), None, SubjectError, 422),
    (" ", None, SubjectError, 422),
    ("c-9", {"reason": "r" * (MAX_REASON + 1)}, ApiError, 422),
    ("c-9", {"reason": "line\nbreak"}, SubjectError, 422),
    ("c-9", {"reason": 7}, ApiError, 422),
    ("c-9", {"reason": "ok", "force": True}, ApiError, 422),
]


def test_a_bad_erase_request_is_refused_and_changes_nothing(served: Served) -> None:
    job_id = _finished_job(served, "c-9")
    auth = {"Authorization": served.keys["admin"]}
    with served.client("admin") as admin:
        for subject, body, error, status in BAD_ERASURES:
            path = f"/api/subjects/{quote(subject, safe='')}/erase"
            answer = httpx.post(served.url + path, json=body, headers=auth)
            assert answer.status_code == status, answer.text
            expected = "invalid_request" if error is ApiError else getattr(error, "code", "")
            assert answer.json()["error"]["code"] == expected, answer.text
            assert "r" * 100 not in answer.text  # an over-long reason is not echoed
            if body is None or (isinstance(body.get("reason"), str) and len(body) == 1):
                reason = None if body is None else str(body["reason"])
                with pytest.raises(error):
                    admin.erase(subject, reason=reason)
            assert admin.subject("c-9").erased_at is None
            assert admin.get(job_id).output == st.CANARY  # the key is still there
        for query in ("limit=0", "limit=10001", "limit=x", "after=" + "a" * 65):
            listed = httpx.get(f"{served.url}/api/subjects?{query}", headers=auth)
            assert listed.status_code == 422, (query, listed.text)
            assert listed.json()["error"]["code"] == "invalid_request"
        # the client sends a dot segment as a subject, not as a step up the path
        for dotted in ("..", ".", "a/../b"):
            with pytest.raises(SubjectNotFound):
                admin.subject(dotted)
            with pytest.raises(SubjectNotFound):
                admin.erase(dotted)
    assert EraseSubject.model_fields["reason"].metadata[0].max_length == MAX_REASON


def test_only_admin_keys_list_show_or_erase_subjects(served: Served) -> None:
    job_id = _finished_job(served, "c-10")
    for who in ("observer_a", "approver_a", "agent_a", "agent_b"):
        with served.client(who) as c:
            with pytest.raises(Forbidden):
                c.subjects()
            with pytest.raises(Forbidden):
                c.subject("c-10")
            with pytest.raises(Forbidden):
                c.erase("c-10", reason="mine")
    with served.client("admin") as admin:
        assert admin.subject("c-10").erased_at is None
        assert admin.get(job_id).output == st.CANARY
    assert httpx.get(f"{served.url}/api/subjects").status_code == 401
    assert httpx.post(f"{served.url}/api/subjects/c-10/erase").status_code == 401


def test_the_async_client_lists_shows_and_erases(served: Served, tmp_path: Path) -> None:
    job_id = _finished_job(served, "c-11")

    async def go() -> None:
        async with served.async_client("admin") as admin:
            assert [s.jobs for s in (await admin.subjects()).subjects] == [1]
            first = await admin.subjects(limit=1)
            assert len(first.subjects) == 1 and first.next_after == first.subjects[0].subject_id
            assert (await admin.subjects(limit=1, after=first.next_after)).subjects == []
            assert (await admin.subject("c-11")).job_ids == [job_id]
            with pytest.raises(SubjectNotFound):
                await admin.subject("c-12")
            done = await admin.erase("c-11", reason=None)
            assert done.erased_now and done.receipt.receipt.reason is None
            receipt = tmp_path / "receipt.json"
            receipt.write_bytes(canonical(done.model_dump(mode="json")["receipt"]))
        async with served.async_client("agent_a") as agent:
            with pytest.raises(Forbidden):
                await agent.erase("c-11")

    anyio.run(go)
    keys = json_of(cli_process("keys", "show", "--db", served.db_url, "--json"))
    checked = cli_process("erase", "verify", str(tmp_path / "receipt.json"), "--key",
                          keys["public_key"])  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_command_line_says_not_found_with_its_code(store_url: str, master_key: Path) -> None:
    env = {"AFFIDAVIT_MASTER_KEY": str(master_key)}
    with Runtime(store_url, tools=st.registry(), master_key=master_key) as rt:
        job = rt.submit("pv_everything", {"email": st.CANARY}, subject="c-13")
        assert rt.run_job(job.job_id).status == "waiting"
    unknown = cli_process("subjects", "show", "nobody", "--db", store_url, "--json", env=env)
    assert unknown.returncode == 2, unknown.stderr
    assert json_of(unknown)["error"]["code"] == "subject_not_found"
    shown = json_of(cli_process("subjects", "show", "c-13", "--db", store_url, "--json", env=env))
    assert shown["erased_at"] is None and shown["job_ids"] == [job.job_id]
    # (busy: tests/privacy/test_erase_cancels.py, a job with a call in flight)


def test_subjects_are_listed_a_page_at_a_time(rt: Runtime) -> None:
    for n in range(5):
        job = rt.submit("pv_simple", {"email": st.CANARY}, subject=f"page-{n}")
        if n == 2:  # a subject of two jobs is listed once
            rt.submit("pv_simple", {"email": "x"}, subject="page-2", idempotency_key="again")
        assert job.job_id
    everyone = [r.subject_id for r in rt.store.list_subjects()]
    assert len(everyone) == 5
    pages, after = [], None
    while True:
        page = rt.store.list_subjects(after=after, limit=2)
        pages += [r.subject_id for r in page]
        if len(page) < 2:
            break
        after = page[-1].subject_id
    assert pages == everyone
    assert rt.store.list_subjects(after="0" * 64) == []  # no subject has it
    assert [r.jobs for r in rt.store.list_subjects(everyone[2])] == [2]
    assert rt.store.list_subjects(everyone[2], after=everyone[2]) == []
