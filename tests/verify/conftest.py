from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.examples import refund
from tests.verify.helpers import LEASE, RawDb, refund_job


@pytest.fixture
def make_runtime(store_url: str) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def make(tools: ToolRegistry | None = None, **kw: object) -> Runtime:
        rt = Runtime(store_url, tools=tools or refund.TOOLS, lease_seconds=LEASE, **kw)  # type: ignore[arg-type]
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


@pytest.fixture
def refunded(make_runtime: Callable[..., Runtime], tmp_path: Path) -> tuple[Runtime, str]:
    """A runtime and one completed (sealed) refund job in it."""
    rt = make_runtime()
    return rt, refund_job(rt, tmp_path / "shop")


@pytest.fixture
def raw(store_url: str) -> RawDb:
    return RawDb(store_url)
