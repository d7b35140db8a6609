"""Fifty concurrent verifications of one agent end with the counters and the score of some
serial order: no update is lost (both backends; PostgreSQL serializes on the agent's row)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from affidavit.claims import ClaimService
from affidavit.store import Store

N = 50


def test_concurrent_verifications_lose_no_update(store: Store) -> None:
    svc = ClaimService(store)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")

    def one(i: int) -> float:
        command = "true" if i % 5 else "false"  # 40 accurate, 10 inaccurate
        result = svc.verify_claim("alice", "custom", {"return_code": 0}, command, "vera")
        return result.new_trust_score

    with ThreadPoolExecutor(max_workers=N) as pool:
        returned = list(pool.map(one, range(N)))

    agent = svc.get_agent("alice")
    assert (agent.verifications, agent.accurate_verifications) == (N, 40)
    log = svc.get_trust_history("alice")[1:]
    assert len(log) == N
    # The log is the serial order the database chose: replaying its observations from 0.5
    # reproduces every recorded step and the final score.
    score = 0.5
    for entry in log:
        payload = entry.payload
        assert payload["score_before"] == score  # each update saw the previous one
        score = 0.1 * payload["observation"] + 0.9 * score
        assert payload["score_after"] == pytest.approx(score, abs=1e-12)
        score = payload["score_after"]
    assert agent.trust_score == score
    assert sorted(returned) == sorted(e.payload["score_after"] for e in log)
    assert svc.check_trust_log("alice")["ok"]
    assert len(svc.get_verification_history("alice", limit=1000)) == N
