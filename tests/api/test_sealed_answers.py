"""A sealed job's trace, verification and pack are computed once per server and served again
(saying so: ``cached``, ``computed_at``); ``fresh=1`` computes them from the store as it is
now, so a job tampered with after its answer was kept is still reported. Over real HTTP, on
both backends."""

from __future__ import annotations

import json
from typing import Any

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.api.sealed import CACHED_HEADER, COMPUTED_AT_HEADER
from affidavit.faces.sealed_cache import SealedAnswer, SealedCache
from affidavit.record._sealing import SigningKey
from affidavit.store import open_store
from tests.api.conftest import TOOLS, Api, Server, make_keys
from tests.api.test_pack_api import pack_api
from tests.api.test_verify_api import finished_job, verdict
from tests.verify.helpers import RawDb

__all__ = ["pack_api"]  # (the fixture, imported to be used here)


def tamper_a_result(api: Api, job_id: str) -> None:
    """Change a recorded tool result in the events table with SQL, leaving its chain hash: a
    record that no longer matches its seal (what someone with write access could do)."""
    raw = RawDb(api.store.url)
    for version, _event_id, event_type, payload, _hash in raw.events(job_id):
        if event_type == "tool_invocation_finished":
            doc = json.loads(payload)
            doc["result"] = {"forged": True}
            raw.set_payload(job_id, version, json.dumps(doc).encode())
            return
    raise AssertionError(f"job {job_id} records no tool result")


def get(api: Api, who: str, path: str, **params: Any) -> dict[str, Any]:
    with api.client(who) as c:
        response = c.get(path, params=params)
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc


def test_a_sealed_jobs_trace_and_verification_are_served_from_the_cache(api: Api) -> None:
    job_id = finished_job(api)
    for kind in ("trace", "verify"):
        path = f"/api/jobs/{job_id}/{kind}"
        first = get(api, "observer_a", path)
        again = get(api, "observer_a", path)
        assert (first["cached"], again["cached"]) == (False, True), kind
        assert again["computed_at"] == first["computed_at"]
        assert {**again, "cached": False} == first  # the same answer, said to be kept
        other_reader = get(api, "approver_a", path)  # kept for the job, not for one key
        assert other_reader["cached"] is True
    with api.client("agent_b") as c:  # kept answers are no way around the namespace check
        assert c.get(f"/api/jobs/{job_id}/trace").status_code == 404
        assert c.get(f"/api/jobs/{job_id}/verify").status_code == 404


def test_fresh_detects_a_job_tampered_after_its_answer_was_kept(api: Api) -> None:
    """The kept verdict says when it was computed; ``fresh=1`` verifies the store as it is
    now, fails, and is kept in its place; a trace computed fresh shows the forged result."""
    job_id = finished_job(api)
    path = f"/api/jobs/{job_id}/verify"
    trace_path = f"/api/jobs/{job_id}/trace"
    before = get(api, "observer_a", path)
    traced = get(api, "observer_a", trace_path)
    assert before["ok"] is True and before["cached"] is False
    tamper_a_result(api, job_id)

    kept = get(api, "observer_a", path)
    assert kept["cached"] is True and kept["ok"] is True
    assert kept["computed_at"] == before["computed_at"]
    fresh = get(api, "observer_a", path, fresh=1)
    assert fresh["cached"] is False and fresh["ok"] is False
    assert fresh["stored_chain"]["ok"] is False
    assert fresh["computed_at"] > before["computed_at"]
    after = get(api, "observer_a", path)  # the newest answer is the one kept now
    assert after["cached"] is True and after["ok"] is False
    assert after["computed_at"] == fresh["computed_at"]

    kept_trace = get(api, "observer_a", trace_path)
    assert kept_trace["cached"] is True and kept_trace["nodes"] == traced["nodes"]
    fresh_trace = get(api, "observer_a", trace_path, fresh=1)
    assert fresh_trace["cached"] is False
    assert {"forged": True} in [n.get("output") for n in fresh_trace["nodes"]]
    assert {"forged": True} not in [n.get("output") for n in kept_trace["nodes"]]


def test_a_replaced_seal_is_not_answered_from_the_old_one(api: Api) -> None:
    """The answer is kept under the seal's hash: with the seal row deleted the job is
    verified again (and fails), never answered from what was kept for the seal."""
    job_id = finished_job(api)
    path = f"/api/jobs/{job_id}/verify"
    assert get(api, "observer_a", path)["ok"] is True
    RawDb(api.store.url).execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    now = get(api, "observer_a", path)
    assert now["cached"] is False and now["ok"] is False
    assert now["seal"]["present"] is False


def test_pinned_keys_are_part_of_the_kept_answer(api: Api) -> None:
    job_id = finished_job(api)
    ours = api.runtime.sealer.key().public
    path = f"/api/jobs/{job_id}/verify"
    assert get(api, "observer_a", path)["ok"] is True
    assert get(api, "observer_a", path)["cached"] is True
    pinned = get(api, "observer_a", path, trusted_key=ours.key_id)
    assert pinned["cached"] is False and pinned["ok"] is True
    assert get(api, "observer_a", path, trusted_key=ours.key_id)["cached"] is True
    other = SigningKey.generate().public.public_key_b64  # a key, not the one that sealed
    refused = get(api, "observer_a", path, trusted_key=other)
    assert refused["cached"] is False and refused["ok"] is False
    assert verdict(get(api, "observer_a", path, trusted_key=other))["ok"] is False


def test_unsealed_jobs_are_never_kept(api: Api) -> None:
    job_id = api.waiting_job()
    for kind in ("trace", "verify"):
        path = f"/api/jobs/{job_id}/{kind}"
        answers = [get(api, "observer_a", path) for _ in range(3)]
        assert [a["cached"] for a in answers] == [False, False, False], kind
        assert answers[0]["computed_at"] < answers[2]["computed_at"]
    assert get(api, "observer_a", f"/api/jobs/{job_id}/trace")["waiting_for"]


def test_a_sealed_jobs_pack_is_made_once_and_fresh_remakes_it(pack_api: Api) -> None:
    job_id = finished_job(pack_api)
    path = f"/api/jobs/{job_id}/pack"
    with pack_api.client("observer_a") as c:
        first, again = c.get(path), c.get(path)
        assert first.status_code == again.status_code == 200
        assert (first.headers[CACHED_HEADER], again.headers[CACHED_HEADER]) == ("false", "true")
        assert first.headers[COMPUTED_AT_HEADER] == again.headers[COMPUTED_AT_HEADER]
        assert again.content == first.content
        assert again.headers["content-disposition"] == first.headers["content-disposition"]
        tamper_a_result(pack_api, job_id)
        assert c.get(path).headers[CACHED_HEADER] == "true"
        remade = c.get(path, params={"fresh": 1})  # the record no longer verifies: no pack
        assert remade.status_code == 409 and remade.json()["error"]["code"] == "pack_error"


def test_the_cache_keeps_at_most_its_budget_least_recently_used_out() -> None:
    cache = SealedCache(max_bytes=10 * 1000)
    answer = SealedAnswer(b"x" * (1000 - 256 - 10), "t")  # 990 bytes counted with overhead
    for i in range(12):
        assert cache.put(("trace", str(i)), answer)
    assert len(cache) == 10 and cache.bytes_used <= cache.max_bytes
    assert cache.get(("trace", "0")) is None and cache.get(("trace", "1")) is None
    assert cache.get(("trace", "2")) is answer  # now the most recently used
    cache.put(("trace", "12"), answer)
    assert cache.get(("trace", "2")) is answer and cache.get(("trace", "3")) is None
    too_large = SealedAnswer(b"x" * 2000, "t")  # over a tenth of the budget: not kept
    assert not cache.put(("trace", "2"), too_large)
    assert cache.get(("trace", "2")) is None  # (and what was kept under its key is gone)
    off = SealedCache(max_bytes=0)
    assert not off.put(("trace", "0"), answer) and off.get(("trace", "0")) is None


def test_a_server_without_a_cache_computes_every_answer(store_url: str) -> None:
    store = open_store(store_url)
    keys = make_keys(store)
    app = create_app(store, rate_limit=None, sealed_cache_bytes=0)
    with Server(app) as url, Runtime(store_url, tools=TOOLS) as rt:
        api = Api(url, store, rt, keys)
        job_id = finished_job(api)
        answers = [get(api, "observer_a", f"/api/jobs/{job_id}/verify") for _ in range(2)]
    store.close()
    assert [a["cached"] for a in answers] == [False, False]
    assert all(a["ok"] for a in answers)
