from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from affidavit import Runtime, ToolRegistry


@pytest.fixture
def make_runtime(store_url: str) -> Iterator[Callable[[ToolRegistry], Runtime]]:
    opened: list[Runtime] = []

    def make(tools: ToolRegistry) -> Runtime:
        rt = Runtime(store_url, tools=tools, lease_seconds=0.3)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()
