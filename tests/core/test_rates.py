"""The rate syntax and the sliding-window arithmetic of the limiters (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.rates import Rate, allowed_starts, parse_rate, worst_window
from tests.conftest import examples


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/60s", Rate(100, 60.0)),
        ("5/1s", Rate(5, 1.0)),
        ("5/s", Rate(5, 1.0)),
        ("10/1m", Rate(10, 60.0)),
        ("3/2h", Rate(3, 7200.0)),
        ("1/1d", Rate(1, 86400.0)),
        ("50/500ms", Rate(50, 0.5)),
        (" 7 / 1.5s ", Rate(7, 1.5)),
    ],
)
def test_parse(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize(
    "text",
    ["", "5", "5/", "/1s", "5/1", "0/1s", "-1/1s", "5/0s", "5/1y", "5/400d", "1/0.5ms", "x" * 100],
)
def test_bad_rates_refused_with_a_hint(text: str) -> None:
    with pytest.raises(ValueError, match="N/PERIOD"):
        parse_rate(text)


def test_not_text_refused() -> None:
    with pytest.raises(ValueError, match="text"):
        parse_rate(5)  # type: ignore[arg-type]


@settings(max_examples=examples(200, 5000), deadline=None)
@given(
    count=st.integers(1, 6),
    period=st.sampled_from([0.5, 1.0, 3.0]),
    gaps=st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0]), max_size=60),
)
def test_greedy_admission_keeps_every_window(count: int, period: float, gaps: list[float]) -> None:
    """Admitting each request exactly when allowed_starts says one more fits: no window of
    the period ever holds more than ``count`` (worst_window), and no request was refused while
    its window held fewer."""
    rate = Rate(count, period)
    admitted: list[float] = []
    now = 0.0
    for gap in gaps:
        now += gap
        free = allowed_starts(rate, admitted, now)
        in_window = sum(1 for t in admitted if now - period < t <= now)
        assert free == max(0, count - in_window)
        if free:
            admitted.append(now)
    worst, at = worst_window(rate, admitted)
    assert worst <= count
    assert (worst == 0) == (at is None)
    # the worst window is really one: count it by brute force at its end
    if at is not None:
        assert sum(1 for t in admitted if at - period < t <= at) == worst


@settings(max_examples=examples(200, 5000), deadline=None)
@given(
    starts=st.lists(st.integers(0, 40).map(lambda n: n / 4), max_size=40),
    period=st.sampled_from([0.25, 1.0, 2.5]),
)
def test_worst_window_is_the_maximum(starts: list[float], period: float) -> None:
    rate = Rate(1, period)
    worst, _ = worst_window(rate, starts)
    brute = max((sum(1 for t in starts if e - period < t <= e) for e in starts), default=0)
    assert worst == brute
