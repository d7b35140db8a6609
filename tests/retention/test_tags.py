"""Job tags: submitted with the job, recorded in its ``job_created``, listed by (AND), bounded."""

from __future__ import annotations

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.tags import MAX_TAGS, InvalidTags, check_tags, parse_tags
from affidavit.store import JobFilter
from affidavit.store.tags import read_tags
from affidavit.verify import verify_job
from tests.runtime.helpers import node, plan


def _tools() -> ToolRegistry:
    def echo(ctx: ToolContext, x: int) -> dict[str, int]:
        return {"x": x}

    return ToolRegistry((Tool("echo", echo, "tool"),))


def test_tags_are_recorded_listed_and_matched_with_and(store_url: str) -> None:
    with Runtime(store_url, tools=_tools()) as rt:
        p = plan(node("a", "echo", args={"x": 1}))
        gold_eu = rt.submit(p, {}, tags={"plan": "gold", "region": "eu"}).job_id
        gold_us = rt.submit(p, {}, tags={"plan": "gold", "region": "us"}).job_id
        plain = rt.submit(p, {}).job_id
        rt.run_until_idle()

        def listed(*pairs: tuple[str, str]) -> set[str]:
            return {j.job_id for j in rt.store.list_jobs(JobFilter(tags=pairs))}

        assert listed(("plan", "gold")) == {gold_eu, gold_us}
        assert listed(("plan", "gold"), ("region", "eu")) == {gold_eu}
        assert listed(("plan", "gold"), ("region", "asia")) == set()
        assert listed() == {gold_eu, gold_us, plain}
        assert read_tags(rt.store, [gold_eu, plain]) == {gold_eu: {"plan": "gold", "region": "eu"}}
        created = rt.store.list_events(gold_eu)[0]
        assert created.type == "job_created"
        assert created.payload["tags"] == {"plan": "gold", "region": "eu"}
        assert "tags" not in rt.store.list_events(plain)[0].payload
        assert verify_job(rt.store, gold_eu).ok


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"": "x"}, "must start with a letter"),
        ({"a b": "x"}, "must start with a letter"),
        ({"k" * 65: "x"}, "over 64"),
        ({"k": "v" * 257}, "over 256"),
        ({"k": "line\nbreak"}, "control character"),
        ({"k": 7}, "is not a text"),
        ({f"k{i}": "v" for i in range(MAX_TAGS + 1)}, "at most 16"),
        (["plan", "gold"], "must be an object"),
    ],
)
def test_bad_tags_are_refused_before_anything_is_written(
    store_url: str, tags: object, message: str
) -> None:
    with Runtime(store_url, tools=_tools()) as rt:
        with pytest.raises(InvalidTags, match=message) as caught:
            rt.submit(plan(node("a", "echo", args={"x": 1})), {}, tags=tags)  # type: ignore[arg-type]
        assert caught.value.code == "invalid_tags" and "personal data" in caught.value.hint
        assert rt.store.list_jobs() == []


def test_command_line_tags() -> None:
    assert parse_tags(["plan=gold", "note=a=b", "empty="]) == {
        "empty": "",
        "note": "a=b",
        "plan": "gold",
    }
    with pytest.raises(InvalidTags, match="not KEY=VALUE"):
        parse_tags(["plan"])
    with pytest.raises(InvalidTags, match="given twice"):
        parse_tags(["plan=a", "plan=b"])
    assert check_tags(None) == {}
