"""The arithmetic of schedule slots and catch-up (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.errors import ConfigError
from affidavit.runtime._schedule_slots import (
    MAX_CATCH_UP,
    Slots,
    check_cron,
    check_timezone,
    due,
    iso_slot,
    parse_every,
)
from tests.conftest import examples

periods = st.integers(min_value=1, max_value=7 * 86400)
times = st.integers(min_value=0, max_value=4_000_000_000)


def _multiples(every: int, after: int, upto: int) -> list[int]:
    """The slots in (after, upto] by brute force."""
    first = after + 1
    while first % every:
        first += 1
    return list(range(first, upto + 1, every))


@settings(max_examples=examples(300, 5000), deadline=None)
@given(periods, times, st.integers(min_value=0, max_value=5000), st.integers(1, 150))
def test_every_slots_are_the_multiples_of_the_period_since_the_epoch(
    every: int, after: int, span: int, limit: int
) -> None:
    slots = Slots(None, every)
    upto = after + span
    expected = _multiples(every, after, upto) if span <= 5000 else []
    assert slots.latest(after, upto, limit) == expected[-limit:]
    if expected:
        assert slots.count(after, expected[-1]) == len(expected) - 1
    assert slots.next_after(after) % every == 0
    assert after < slots.next_after(after) <= after + every


@settings(max_examples=examples(300, 5000), deadline=None)
@given(
    periods,
    times,
    st.integers(min_value=0, max_value=20_000),
    st.floats(min_value=0, max_value=0.999),
    st.sampled_from(["none", "latest", "all"]),
)
def test_catch_up_decides_every_missed_slot_once(
    every: int, after: int, span: int, fraction: float, mode: str
) -> None:
    slots = Slots(None, every)
    now = after + span + fraction
    missed = _multiples(every, after, after + span)
    decided = due(slots, after, now, mode)
    # every slot up to now is decided: fired or skipped, none twice, none in the future
    assert len(decided.fire) + decided.skipped == len(missed)
    assert list(decided.fire) == sorted(set(decided.fire))
    assert set(decided.fire) <= set(missed)
    assert decided.through == (missed[-1] if missed else None)
    if mode == "all":
        assert list(decided.fire) == missed[-MAX_CATCH_UP:]
    elif mode == "latest":
        assert list(decided.fire) == missed[-1:]
    else:
        late = bool(missed) and now - missed[-1] > min(60, every)
        assert list(decided.fire) == ([] if late else missed[-1:])


@settings(max_examples=examples(60, 1000), deadline=None)
@given(
    st.sampled_from(["0 2 * * *", "*/15 * * * *", "30 1 * * 1-5", "0 */6 1,15 * *"]),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
    st.integers(min_value=1_700_000_000, max_value=1_900_000_000),
)
def test_cron_slots_are_croniters_in_the_time_zone(expr: str, tz: str, start: int) -> None:
    slots = Slots(expr, None, tz)
    zone = ZoneInfo(tz)
    it = croniter(expr, datetime.fromtimestamp(start, zone))
    expected: list[int] = []
    seen: set[str] = set()
    while len(expected) < 5:
        slot = int(it.get_next(float))
        wall = datetime.fromtimestamp(slot, zone).strftime("%Y-%m-%d %H:%M")
        if wall in seen and expr.split()[1] != "*":
            continue  # a wall-clock time repeated by a daylight-saving change: once
        seen.add(wall)
        expected.append(slot)
    got = [slots.next_after(start)]
    while len(got) < 5:
        got.append(slots.next_after(got[-1]))
    assert got == expected
    assert slots.latest(start, got[-1], 10) == got
    assert slots.latest(start, got[-1], 2) == got[-2:]
    assert slots.count(start, got[-1]) == 4


def test_a_repeated_wall_clock_time_fires_once_and_an_hourly_schedule_each_hour() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    day = datetime(2026, 10, 24, 12, tzinfo=berlin).timestamp()
    nightly = Slots("30 2 * * *", None, "Europe/Berlin")
    fired = nightly.latest(int(day), int(day) + 3 * 86400, 10)
    local = [datetime.fromtimestamp(s, berlin).strftime("%m-%d %H:%M %Z") for s in fired]
    assert local == ["10-25 02:30 CEST", "10-26 02:30 CET", "10-27 02:30 CET"]
    hourly = Slots("0 * * * *", None, "Europe/Berlin")
    start = int(datetime(2026, 10, 25, 0, tzinfo=berlin).timestamp())
    end = int(datetime(2026, 10, 26, 0, tzinfo=berlin).timestamp())
    assert len(hourly.latest(start - 1, end - 1, 100)) == 25  # the day has 25 hours


def test_a_wall_clock_time_that_does_not_exist_fires_at_the_first_instant_after_it() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start = int(datetime(2026, 3, 28, 12, tzinfo=berlin).timestamp())
    first = Slots("30 2 * * *", None, "Europe/Berlin").next_after(start)
    assert datetime.fromtimestamp(first, berlin).strftime("%m-%d %H:%M %Z") == "03-29 03:00 CEST"


def test_iso_slot_is_utc_to_the_second() -> None:
    assert iso_slot(1796176800) == "2026-12-02T02:00:00Z"
    assert datetime.fromtimestamp(1796176800, UTC).hour == 2


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("61 * * * *", "invalid cron expression"),
        ("* * * * * *", "6 fields, not 5"),
        ("0 2 * *", "4 fields, not 5"),
        ("0 2 * * mon-xyz", "invalid cron expression"),
        ("* " * 150, "too long"),
        ("", "0 fields"),
        ("0 0 31 2 *", "never fires"),
    ],
)
def test_a_bad_cron_expression_is_refused_with_a_hint(expr: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        check_cron(expr)
    assert "Five fields" in (caught.value.hint or "")


@pytest.mark.parametrize("name", ["Mars/Base", "", "../../etc/passwd", "x" * 200, "Europe/"])
def test_a_bad_time_zone_is_refused_with_a_hint(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown time zone") as caught:
        check_timezone(name)
    assert "IANA" in (caught.value.hint or "")


@pytest.mark.parametrize(
    ("text", "seconds"), [("1s", 1), ("30s", 30), ("5m", 300), ("2h", 7200), ("1d", 86400)]
)
def test_every_reads_a_number_and_a_unit(text: str, seconds: int) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize("text", ["0s", "1", "1.5s", "-1s", "1w", "367d", "s", "99999999999s"])
def test_a_bad_period_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--every"):
        parse_every(text)
