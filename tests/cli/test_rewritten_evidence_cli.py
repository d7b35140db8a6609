"""An evidence body rewritten in the database (its triggers dropped, as the database's owner
can) is reported by every reader — `trust show`, `claims history`, `verify --all` and the API —
instead of the altered verdict being shown. Both backends."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from affidavit.api.app import create_app
from affidavit.claims import ClaimService
from affidavit.faces.auth import create_api_key
from affidavit.store import open_store
from tests.api.conftest import Server
from tests.cli.test_cli import cli, json_of
from tests.cli.test_tampered_rows_cli import unlock_claims_tables
from tests.verify.helpers import RawDb


def inaccurate_claim(url: str) -> str:
    """alice's claim judged inaccurate by vera; its verification id."""
    store = open_store(url)
    try:
        svc = ClaimService(store)
        svc.add_agent("alice", namespace="team", role="agent")
        svc.add_agent("vera", namespace="team", role="agent")
        result = svc.verify_claim("alice", "custom", {"return_code": 0}, "false", "vera")
        assert result.verdict == "inaccurate"
        return result.verification_id
    finally:
        store.close()


def rewrite(url: str, verification_id: str, *, with_id: bool) -> None:
    """Turn the stored verdict into "accurate" (and, ``with_id``, the evidence id with it)."""
    raw = RawDb(url)
    unlock_claims_tables(raw)
    [(body,)] = raw.rows(
        "SELECT evidence FROM claim_verifications WHERE verification_id = ?", (verification_id,)
    )
    forged = bytes(body).replace(b'"verdict":"inaccurate"', b'"verdict":"accurate"')
    forged = forged.replace(b'"accurate":false', b'"accurate":true')
    assert forged != bytes(body)
    if with_id:
        sql = (
            "UPDATE claim_verifications SET evidence = ?, verdict = 'accurate', evidence_id = ? "
            "WHERE verification_id = ?"
        )
        params: tuple[object, ...] = (forged, hashlib.sha256(forged).hexdigest(), verification_id)
    else:
        sql = (
            "UPDATE claim_verifications SET evidence = ?, verdict = 'accurate' "
            "WHERE verification_id = ?"
        )
        params = (forged, verification_id)
    assert raw.execute(sql, params) == 1


@pytest.mark.parametrize("with_id", [False, True], ids=["body", "body-and-id"])
def test_a_rewritten_evidence_body_is_reported(store_url: str, with_id: bool) -> None:
    verification_id = inaccurate_claim(store_url)
    before = cli("trust", "show", "alice", "--db", store_url, "--json")
    assert before.returncode == 0 and json_of(before)["trust_log"]["evidence_ok"] is True
    rewrite(store_url, verification_id, with_id=with_id)

    shown = cli("trust", "show", "alice", "--db", store_url, "--json")
    assert shown.returncode == 1
    check = json_of(shown)["trust_log"]
    assert check["ok"] is False and check["evidence_ok"] is False
    assert verification_id in check["evidence_problems"][0]

    history = cli("claims", "history", "alice", "--db", store_url, "--json")
    assert history.returncode == 1, history.stdout
    assert json_of(history)["error"]["code"] == "record_tampered"
    human = cli("claims", "history", "alice", "--db", store_url)
    assert human.returncode == 1 and "accurate" not in human.stdout
    stats = cli("claims", "stats", "alice", "--db", store_url, "--json")
    assert stats.returncode == 1 and json_of(stats)["error"]["code"] == "record_tampered"

    every = cli("verify", "--all", "--db", store_url, "--json")
    assert every.returncode == 1
    assert list(json_of(every)["failed_agents"]) == ["alice"]

    store = open_store(store_url)
    try:
        _, key = create_api_key(store, agent_id="vera", role="observer", namespace="team")
        with Server(create_app(store)) as url:
            r = httpx.get(
                f"{url}/api/agents/alice/verifications",
                headers={"Authorization": f"Bearer {key}"},
            )
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "record_tampered"
    finally:
        store.close()
