"""The decorators refuse what the runtime could not use, where the decorator is written."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import affidavit
from affidavit import ConfigError, ToolContext
from affidavit.runtime._sdk import Tool, ToolError, registry

_names = itertools.count()


def fresh_name() -> str:
    return f"sdk_test_{next(_names)}"


def plain(ctx: ToolContext) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize("decorator", [affidavit.tool, affidavit.pure])
@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"retry": 0}, "must be an integer ≥ 1, not 0"),
        ({"retry": True}, "must be an integer ≥ 1, not True"),
        ({"retry": "3"}, "must be an integer ≥ 1, not '3'"),
        ({"retry": 1.5}, "must be an integer ≥ 1, not 1.5"),
        ({"version": 2}, "version of tool"),
    ],
    ids=["retry-0", "retry-True", "retry-str", "retry-float", "version-int"],
)
def test_bad_options_are_refused(decorator: Any, options: dict[str, Any], what: str) -> None:
    name = fresh_name()
    with pytest.raises(ConfigError, match=what):
        decorator(name, **options)
    assert name not in registry


@pytest.mark.parametrize(
    "retry_on", [ValueError, ("x",), (1,), (ValueError, int)], ids=["bare", "str", "int", "mix"]
)
def test_retry_on_must_be_exception_types(retry_on: Any) -> None:
    name = fresh_name()
    with pytest.raises(ConfigError, match=r"retry_on of tool .* must be a tuple of exception"):
        affidavit.tool(name, retry_on=retry_on)
    assert name not in registry


@pytest.mark.parametrize("name", ["", 123, None])
def test_a_name_is_a_non_empty_string(name: Any) -> None:
    with pytest.raises(ConfigError, match="non-empty string"):
        affidavit.tool(name)


@pytest.mark.parametrize("decorator", [affidavit.tool, affidavit.pure])
def test_async_functions_are_refused(decorator: Any) -> None:
    async def fetch(ctx: ToolContext) -> dict[str, Any]:
        return {}

    name = fresh_name()
    with pytest.raises(ToolError, match="async function"):
        decorator(name)(fetch)
    assert name not in registry


def test_decorating_twice_is_refused() -> None:
    inner, outer = fresh_name(), fresh_name()
    registered = affidavit.tool(inner)(plain)
    with pytest.raises(ToolError, match=f"{inner!r} is already registered as a tool"):
        affidavit.tool(outer)(registered)
    assert outer not in registry


def test_good_options_register() -> None:
    name = fresh_name()
    t = affidavit.tool(name, version="2", retry=3, retry_on=[TimeoutError], in_flight="fail")(plain)
    assert registry.get(name) is t
    assert (t.version, t.retry, t.retry_on, t.in_flight) == ("2", 3, (TimeoutError,), "fail")


def test_one_function_under_one_name_with_other_settings_is_refused() -> None:
    """The second registration used to replace the first silently, so which version (or
    retry policy, or reconcile hook) the ledger ran with depended on import order."""
    name = fresh_name()
    first = affidavit.tool(name, version="1")(plain)
    with pytest.raises(ToolError, match=f"{name!r} is registered twice with different settings "
                       r"\(version '1' and '2'\)"):  # fmt: skip
        affidavit.tool(name, version="2")(plain)
    with pytest.raises(ToolError, match="registered twice with different settings"):
        affidavit.tool(name, version="1", retry=5)(plain)
    assert registry.get(name) is first
    registry.add(Tool(name, plain, "tool", version="1"))  # the same tool again: a no-op
    assert registry.get(name) is first
