"""Tags over the API and the client (sync and async), against a real server on loopback, on
both backends: submitted, carried by the job model, listed by (every tag must match), bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from affidavit import AsyncClient
from affidavit.core.tags import InvalidTags
from tests.api.conftest import Api
from tests.client.helpers import client, key

ONE_TOOL: dict[str, Any] = {"nodes": [{"id": "a", "type": "tool", "tool": "act"}]}


def test_submit_and_list_by_tags(api: Api) -> None:
    with client(api, "agent_a") as c:
        gold = c.submit(ONE_TOOL, {}, tags={"plan": "gold", "region": "eu"})
        silver = c.submit(ONE_TOOL, {}, tags={"plan": "silver", "region": "eu"})
        untagged = c.submit(ONE_TOOL, {})
        assert gold.tags == {"plan": "gold", "region": "eu"} and untagged.tags is None
        assert c.get(gold.job_id).tags == {"plan": "gold", "region": "eu"}
        assert api.store.list_events(gold.job_id)[0].payload["tags"] == gold.tags
        by_plan = c.list(tag={"plan": "gold"}, limit=1000).jobs
        assert [j.job_id for j in by_plan] == [gold.job_id] and by_plan[0].tags == gold.tags
        eu = {j.job_id for j in c.list(tag="region=eu", limit=1000).jobs}
        assert eu == {gold.job_id, silver.job_id}
        assert c.list(tag=["region=eu", "plan=silver"], limit=1000).jobs[0].job_id == silver.job_id
        with pytest.raises(InvalidTags, match="over 64"):
            c.submit(ONE_TOOL, {}, tags={"k" * 65: "v"})
        with pytest.raises(InvalidTags, match="not KEY=VALUE"):
            c.list(tag="plan")


def test_async_client_tags(api: Api) -> None:
    async def go() -> None:
        async with AsyncClient(api.url, api_key=key(api, "agent_a")) as c:
            job = await c.submit(ONE_TOOL, {}, tags={"batch": "2026-12"})
            assert job.tags == {"batch": "2026-12"}
            listed = await c.list(tag={"batch": "2026-12"}, limit=1000)
            assert [j.job_id for j in listed.jobs] == [job.job_id]

    asyncio.run(go())
