"""``Store.get_seals`` on both backends: the seals of the jobs that have one, by job id, equal
to what ``get_seal`` reads one by one, for any number of ids (several statements past 500)."""

from __future__ import annotations

from affidavit import Runtime, Tool, ToolRegistry

ONE = {"name": "one", "nodes": [{"id": "a", "type": "tool", "tool": "act", "args": {"x": 1}}]}
WAITS = {"name": "waits", "nodes": [{"id": "w", "type": "wait"}]}


def test_get_seals_reads_the_seals_of_many_jobs(store_url: str) -> None:
    with Runtime(store_url, tools=ToolRegistry([Tool("act", lambda ctx, x: x, "tool")])) as rt:
        sealed = [rt.submit(ONE).job_id for _ in range(3)]
        unsealed = rt.submit(WAITS).job_id
        rt.run_until_idle()
        store = rt.store
        ids = [*sealed, unsealed, "no-such-job", "", sealed[0]]
        found = store.get_seals(ids)
        assert set(found) == set(sealed)
        assert all(found[j] == store.get_seal(j) for j in sealed)
        many = [*(f"missing-{i}" for i in range(1200)), sealed[2]]  # three statements
        assert list(store.get_seals(many)) == [sealed[2]]
        assert store.get_seals([]) == {}
