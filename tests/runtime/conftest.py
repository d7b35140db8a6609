"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import Calls


@pytest.fixture
def calls() -> Calls:
    """A side channel of every real tool call, in order."""
    return Calls()
