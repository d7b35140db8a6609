"""Subjects and erasure through the faces: the command line (real processes), the HTTP API and
the Python client against a real server on loopback; readers open a subject's values while its
key exists and show them erased after, never failing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.core.privacy import ERASED, FileKeyProvider, is_sealed
from affidavit.privacy import erase
from affidavit.store import open_store
from tests.api.conftest import Api, Server, make_keys
from tests.cli.test_cli import cli, json_of
from tests.client.helpers import client
from tests.privacy import subject_tools as st

TOOLS = str(Path(st.__file__).resolve())


def test_the_command_line_submits_lists_erases_and_verifies(
    store_url: str, master_key: Path, tmp_path: Path
) -> None:
    env = {"AFFIDAVIT_MASTER_KEY": str(master_key)}
    db = ["--db", store_url]
    submitted = cli("submit", "--agent", "pv_simple", "--tools", TOOLS, "--input",
                    json.dumps({"email": st.CANARY}), "--subject", "customer-7", *db, "--json",
                    env=env)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = json_of(submitted)["job_id"]
    ran = cli("worker", "--tools", TOOLS, "--until-idle", *db, "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    shown = json_of(cli("jobs", "show", job_id, *db, "--json", env=env))
    assert shown["output"] == st.CANARY
    listed_jobs = json_of(cli("jobs", "list", *db, "--json", env=env))
    assert [j["output"] for j in listed_jobs] == [st.CANARY]
    events = json_of(cli("jobs", "events", job_id, *db, "--json", env=env))
    assert events[0]["payload"]["input"] == {"email": st.CANARY}
    raw = json_of(cli("jobs", "events", job_id, "--raw", *db, "--json", env=env))
    assert is_sealed(raw[0]["payload"]["input"])
    listed = json_of(cli("subjects", "list", *db, "--json", env=env))["subjects"]
    assert [s["jobs"] for s in listed] == [1]
    assert "customer-7" not in json.dumps(listed)  # never the subject itself
    one = json_of(cli("subjects", "show", "customer-7", *db, "--json", env=env))
    assert one["job_ids"] == [job_id] and one["erased_at"] is None
    receipt = tmp_path / "receipt.json"
    erased = cli("erase", "--subject", "customer-7", "--reason", "request", "--out",
                 str(receipt), *db, "--json", env=env)  # fmt: skip
    assert erased.returncode == 0, erased.stderr
    assert json_of(erased)["receipt"]["receipt"]["job_ids"] == [job_id]
    shown = json_of(cli("jobs", "show", job_id, *db, "--json", env=env))
    assert shown["output"] == ERASED
    listed_jobs = json_of(cli("jobs", "list", *db, "--json", env=env))
    assert [j["output"] for j in listed_jobs] == [ERASED]
    events = json_of(cli("jobs", "events", job_id, *db, "--json", env=env))
    assert events[0]["payload"]["input"] == ERASED
    assert cli("verify", job_id, *db, env=env).returncode == 0
    keys = json_of(cli("keys", "show", *db, "--json", env=env))
    checked = cli("erase", "verify", str(receipt), "--key", keys["public_key"], "--json")
    assert checked.returncode == 0 and json_of(checked)["ok"], checked.stdout
    receipt.write_text(receipt.read_text().replace(job_id, "01-not-the-job"))
    forged = cli("erase", "verify", str(receipt), "--key", keys["public_key"])
    assert forged.returncode == 1
    again = cli("erase", "--subject", "customer-7", *db, "--json", env=env)
    assert again.returncode == 0 and not json_of(again)["erased_now"]
    refused = cli("submit", "--agent", "pv_simple", "--tools", TOOLS, "--subject",
                  "customer-7", "--input", "{\"email\": \"x\"}", *db, env=env)  # fmt: skip
    assert refused.returncode == 3 and "erased" in refused.stderr


def test_a_subject_without_a_master_key_is_refused(store_url: str) -> None:
    out = cli("submit", "--agent", "pv_simple", "--tools", TOOLS, "--subject", "c-7",
              "--input", "{\"email\": \"x\"}", "--db", store_url, "--json",
              env={"AFFIDAVIT_MASTER_KEY": ""})  # fmt: skip
    assert out.returncode == 3
    assert json_of(out)["error"]["code"] == "master_key_error"


@pytest.fixture
def subject_api(store_url: str, master_key: Path) -> Iterator[Api]:
    store = open_store(store_url)
    store.subjects.use(FileKeyProvider.load(master_key))
    tools = st.registry()
    with (
        Server(create_app(store, tools=tools)) as url,
        Runtime(store_url, tools=tools, master_key=master_key) as rt,
    ):
        yield Api(url, store, rt, make_keys(store))
    store.close()


def test_the_api_and_the_client_submit_with_a_subject_and_read_it_erased(
    subject_api: Api,
) -> None:
    with client(subject_api, "agent_a") as c:
        job = c.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")
    assert subject_api.runtime.run_job(job.job_id).status == "completed"
    headers = {"Authorization": subject_api.keys["observer_a"]}
    base = f"{subject_api.url}/api/jobs/{job.job_id}"
    with client(subject_api, "observer_a") as c:
        assert c.get(job.job_id).output == st.CANARY
        listed = httpx.get(f"{subject_api.url}/api/jobs", headers=headers).json()["jobs"]
        assert [j["output"] for j in listed] == [st.CANARY]
        events = httpx.get(f"{base}/events", headers=headers).json()["events"]
        assert events[0]["payload"]["input"] == {"email": st.CANARY}
        raw = httpx.get(f"{base}/events?raw=true", headers=headers).json()["events"]
        assert is_sealed(raw[0]["payload"]["input"])
        # a sealed job's trace is kept by the server for its seal; a subject's never is: it
        # holds the opened values, which must be gone once the key is
        before = httpx.get(f"{base}/trace", headers=headers).json()
        assert st.CANARY in json.dumps(before) and before["cached"] is False
        again = httpx.get(f"{base}/trace", headers=headers).json()
        assert again["cached"] is False
        erase(subject_api.store, "customer-7", sealer=subject_api.runtime.sealer)
        assert c.get(job.job_id).output == ERASED
        listed = httpx.get(f"{subject_api.url}/api/jobs", headers=headers).json()["jobs"]
        assert [j["output"] for j in listed] == [ERASED]
        events = httpx.get(f"{base}/events", headers=headers).json()["events"]
        assert events[0]["payload"]["input"] == ERASED
        trace = httpx.get(f"{base}/trace", headers=headers)
        assert trace.status_code == 200 and st.CANARY not in trace.text
        assert c.verify(job.job_id).ok
        page = httpx.get(f"{subject_api.url}/ui/jobs/{job.job_id}", headers=headers)
        assert page.status_code == 200
    bad = httpx.post(
        f"{subject_api.url}/api/jobs",
        json={"agent": "pv_simple", "input": {"email": "x"}, "subject": "\x00"},
        headers={"Authorization": subject_api.keys["agent_a"]},
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "subject_error"
