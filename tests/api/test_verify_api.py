"""``GET /api/jobs/{id}/verify`` and ``GET /api/keys`` over real HTTP, on both backends."""

from __future__ import annotations

from typing import Any

from affidavit import verify_events, verify_job
from affidavit.record._sealing import SigningKey
from affidavit.verify import verify_one
from tests.api.conftest import WAITING_PLAN, Api
from tests.runtime.helpers import ledger_rows
from tests.verify.helpers import RawDb


def verdict(doc: dict[str, Any]) -> dict[str, Any]:
    """The verification result of an answer of `/verify`: without when and how the server
    computed it (``cached``, ``computed_at``), which ``verify_job`` does not say."""
    assert isinstance(doc.get("cached"), bool) and doc.get("computed_at")
    return {k: v for k, v in doc.items() if k not in ("cached", "computed_at")}


def finished_job(api: Api, namespace: str = "a") -> str:
    job_id = api.waiting_job(namespace)
    with api.client("approver_a" if namespace == "a" else "approver_b") as c:
        yes = {"key": f"{job_id}:ok", "payload": {"approved": True}}
        assert c.post(f"/api/jobs/{job_id}/signal", json=yes).status_code == 200
    api.runtime.run_job(job_id)
    assert api.runtime.get_job(job_id).status == "completed"
    return job_id


def test_verify_endpoint(api: Api) -> None:
    job_id = finished_job(api)
    with api.client("observer_a") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
        assert response.status_code == 200
        doc = response.json()
        assert doc.pop("cached") is False and doc.pop("computed_at")
        assert doc == verify_job(api.store, job_id).to_dict()
        assert doc["ok"] is True and doc["seal"]["present"] is True
        waiting = api.waiting_job("a")
        in_flight = c.get(f"/api/jobs/{waiting}/verify").json()
        assert in_flight["ok"] is True and in_flight["seal"]["present"] is False
        assert c.get("/api/jobs/no-such-job/verify").status_code == 404
    with api.client("agent_b") as c:  # another namespace's job does not exist for the caller
        assert c.get(f"/api/jobs/{job_id}/verify").status_code == 404
    with api.client(None) as c:
        assert c.get(f"/api/jobs/{job_id}/verify").status_code == 401


def test_verify_endpoint_pins_trusted_keys(api: Api) -> None:
    """As `affidavit verify --trusted-key`: a seal by a key the caller did not pin fails the
    seal check, even though the key is recorded in the database; a key that is no key is 422."""
    job_id = finished_job(api)
    ours = api.runtime.sealer.key().public
    other = SigningKey.generate().public
    with api.client("observer_a") as c:
        url = f"/api/jobs/{job_id}/verify"
        pinned = c.get(url, params={"trusted_key": ours.public_key_b64})
        assert pinned.status_code == 200 and pinned.json()["ok"] is True
        by_id = c.get(url, params={"trusted_key": ours.key_id})
        assert by_id.json()["ok"] is True
        elsewhere = c.get(url, params={"trusted_key": [other.public_key_b64]}).json()
        assert elsewhere["ok"] is False and elsewhere["seal"]["ok"] is False
        assert (
            verdict(elsewhere)
            == verify_job(api.store, job_id, trusted_keys=[other.public_key_b64]).to_dict()
        )
        both = c.get(url, params={"trusted_key": [other.public_key_b64, ours.key_id]})
        assert both.json()["ok"] is True
        bad = c.get(url, params={"trusted_key": "not-a-key"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "config_error"


def test_verify_endpoint_reports_a_failed_check_with_200(api: Api) -> None:
    job_id = finished_job(api)
    RawDb(api.store.url).execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    with api.client("admin") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
    assert response.status_code == 200
    doc = response.json()
    assert doc["ok"] is False
    assert doc["seal"] == {
        "present": False,
        "ok": False,
        "key_id": None,
        "event_count": None,
        "error": "the job is completed but has no seal",
        "codes": [],
    }


def test_verify_endpoint_gives_a_verdict_for_an_edited_job_row(api: Api) -> None:
    """A job row whose output is not JSON (edited in the database): 200 with the failed check
    (docs/formats.md §6), not a server error; the seal is still served."""
    job_id = finished_job(api)
    RawDb(api.store.url).execute("UPDATE jobs SET output = 'x' WHERE job_id = ?", (job_id,))
    with api.client("observer_a") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["ok"] is False and doc["replay_proof_result"]["ok"] is False
        assert c.get(f"/api/jobs/{job_id}/seal").json()["seal"]["job_id"] == job_id
    with api.client("agent_b") as c:  # still invisible to another namespace
        assert c.get(f"/api/jobs/{job_id}/verify").status_code == 404


def test_keys_endpoint(api: Api) -> None:
    job_id = finished_job(api)
    seal = api.store.get_seal(job_id)
    assert seal is not None
    with api.client("observer_a") as c:
        keys = c.get("/api/keys").json()["keys"]
    assert seal.key_id in {k["key_id"] for k in keys}
    assert all(k["algorithm"] == "ed25519" and len(k["public_key"]) == 44 for k in keys)
    with api.client(None) as c:
        assert c.get("/api/keys").status_code == 401


def test_verify_endpoint_reports_an_odd_row_with_200(api: Api) -> None:
    """A payload stored as text (an edit in the sqlite3 shell) is a failed check, not a 500.
    PostgreSQL's typed columns refuse that edit."""
    raw = RawDb(api.store.url)
    if not raw.url.startswith("sqlite:///"):
        return
    job_id = finished_job(api)
    raw.execute(
        "UPDATE events SET payload = CAST(payload AS TEXT) WHERE job_id = ? AND version = 3",
        (job_id,),
    )
    with api.client("admin") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
    assert response.status_code == 200
    doc = response.json()
    assert doc["ok"] is False and doc["stored_chain"]["first_bad_version"] == 3
    assert doc["replay_proof_result"]["error"].startswith("payload at version 3: ")


def test_verify_endpoint_reports_a_seal_key_id_that_is_not_utf8_with_200(api: Api) -> None:
    """SQLite text that is not UTF-8 in a field the result quotes (the seal's key id) comes
    out escaped: a failed check, not a 500 from a body that cannot be encoded."""
    raw = RawDb(api.store.url)
    if not raw.url.startswith("sqlite:///"):
        return
    job_id = finished_job(api)
    raw.execute("UPDATE seals SET key_id = CAST(X'ff' AS TEXT) WHERE job_id = ?", (job_id,))
    with api.client("admin") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
    assert response.status_code == 200
    doc = response.json()
    assert doc["ok"] is False
    assert doc["seal"]["key_id"] == "\\udcff"
    assert doc["seal"]["error"] == (
        "the seal is signed by unknown key \\udcff (not registered in this database)"
    )


def test_events_endpoint_answers_an_edited_payload_with_409(api: Api) -> None:
    job_id = finished_job(api)
    raw = RawDb(api.store.url)
    version = raw.events(job_id)[2][0]
    raw.set_payload(job_id, version, b"{'not': 'json'}")
    with api.client("observer_a") as c:
        response = c.get(f"/api/jobs/{job_id}/events")
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "replay_error"
        assert response.json()["error"]["message"] == (
            f"job {job_id}, event {version}: the stored payload is not JSON"
        )
        traced = c.get(f"/api/jobs/{job_id}/trace")  # the trace folds the whole log
        assert traced.status_code == 409
        assert traced.json()["error"] == response.json()["error"]
        before = c.get(f"/api/jobs/{job_id}/events", params={"limit": version - 1})
        assert before.status_code == 200 and len(before.json()["events"]) == version - 1
        assert c.get(f"/api/jobs/{job_id}/verify").json()["ok"] is False


def test_events_endpoint_and_keys_verify_offline_as_verify_job(api: Api) -> None:
    """The log read page by page over HTTP, the keys from /api/keys: verify_events gives the
    verify endpoint's result, for a job in flight and a finished one (odd payloads included)."""
    odd = {"t": "naïve ☃ 𝄞 \u2028", "k": {"𝄞": 1, "\uffff": 2}, "d": [1e-7, 1.7e18, 5.0, 1e21]}
    waiting = api.runtime.submit(WAITING_PLAN, {"x": odd}, namespace="a").job_id
    api.runtime.run_job(waiting)
    done = finished_job(api)
    with api.client("observer_a") as c:
        keys = [k["public_key"] for k in c.get("/api/keys").json()["keys"]]
        for job_id in (waiting, done):
            events: list[dict[str, Any]] = []
            after: int | None = 0
            while after is not None:
                page = c.get(
                    f"/api/jobs/{job_id}/events", params={"after_version": after, "limit": 3}
                ).json()
                events += page["events"]
                after = page["next_after_version"]
            sealed = c.get(f"/api/jobs/{job_id}/seal")
            assert sealed.status_code == 200 and sealed.json()["error"] is None
            seal = sealed.json()["seal"]
            assert (seal is None) == (job_id == waiting)
            offline = verify_events(
                events,
                job_id=job_id,
                seal=seal,
                public_keys=keys,
                ledger=ledger_rows(api.store, job_id),
                status=api.runtime.get_job(job_id).status,
            )
            assert offline.ok
            assert offline.to_dict() == verdict(c.get(f"/api/jobs/{job_id}/verify").json())


def test_seal_endpoint(api: Api) -> None:
    """The seal as `verify_events` takes it; 404 for an unknown job or another namespace's; a
    seal row edited outside the store (SQLite keeps any type) is reported, not a 500."""
    done = finished_job(api)
    with api.client("observer_a") as c:
        seal = c.get(f"/api/jobs/{done}/seal").json()
        assert seal == {"seal": api.store.get_seal(done).to_dict(), "error": None}
        assert c.get("/api/jobs/no-such-job/seal").status_code == 404
    with api.client("agent_b") as other:
        assert other.get(f"/api/jobs/{done}/seal").status_code == 404
    if not api.store.url.startswith("sqlite:///"):
        return  # PostgreSQL's typed columns refuse the edit below
    raw = RawDb(api.store.url)
    raw.execute("UPDATE seals SET key_id = CAST(key_id AS BLOB) WHERE job_id = ?", (done,))
    with api.client("observer_a") as c:
        edited = c.get(f"/api/jobs/{done}/seal")
        assert edited.status_code == 200
        assert edited.json()["seal"] is None and "malformed" in edited.json()["error"]


def test_trace_names_the_wait_type_and_an_answered_approval(api: Api) -> None:
    """As `jobs show` and `jobs trace`: each open wait with its `wait_type`; an approval that
    was given has state `approved` (its outcome stays `pure`)."""
    job_id = api.waiting_job()
    with api.client("observer_a") as c:
        trace = c.get(f"/api/jobs/{job_id}/trace").json()
    assert trace["waiting_for"] == [
        {"node_id": "ok", "wait_type": "approval", "correlation_key": f"{job_id}:ok"}
    ]
    finished = finished_job(api)
    with api.client("observer_a") as c:
        nodes = {n["id"]: n for n in c.get(f"/api/jobs/{finished}/trace").json()["nodes"]}
    assert (nodes["ok"]["state"], nodes["ok"]["outcome"]) == ("approved", "pure")
    assert nodes["a"]["state"] == "side_effect_committed"


def test_verify_endpoint_reports_an_orphan_as_the_cli_does(api: Api) -> None:
    """A job whose job row was deleted, its events, ledger rows and seal left: the API gives
    the same failing result as ``affidavit verify`` (``verify_one``) — to an admin, since such
    records name no namespace; to anyone else it is not found, as an id nothing holds."""
    job_id = finished_job(api)
    RawDb(api.store.url).execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
    with api.client("admin") as c:
        response = c.get(f"/api/jobs/{job_id}/verify")
        assert response.status_code == 200, response.text
        doc = verdict(response.json())
        assert doc == verify_one(api.store, job_id).to_dict()
        assert doc["ok"] is False
        assert "no job row" in doc["replay_proof_result"]["error"]
        assert c.get("/api/jobs/no-such-job/verify").status_code == 404
    with api.client("observer_a") as c:
        assert c.get(f"/api/jobs/{job_id}/verify").status_code == 404
