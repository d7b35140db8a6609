"""The scheduler on both backends, on a clock of the test's own (no real waits): each slot's
job once, under the lease, catch-up after an absence, pause and resume, refusals at ``add``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from affidavit.core.errors import ConfigError, PlanError
from affidavit.runtime import (
    MAX_CATCH_UP,
    Runtime,
    ScheduleNotFound,
    Scheduler,
    ToolRegistry,
    add_schedule,
    check_timing,
    delete_schedule,
    get_schedule,
    list_runs,
    list_schedules,
    set_paused,
    submit_agent_job,
)
from affidavit.runtime._schedule_slots import iso_slot
from affidavit.store import Store, open_store
from affidavit.verify import verify_job
from tests.runtime.sched_tools import REGISTRY, effects

T0 = 1_796_176_800  # 2026-12-02T02:00:00Z


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def every(store: Store, name: str, where: Path, *, at: float, catch_up: str = "all", **kw: Any):
    return add_schedule(
        store,
        name,
        check_timing(None, kw.pop("period", "1s"), None),
        agent="sched_agent",
        tools=REGISTRY,
        input={"dir": str(where)},
        catch_up=catch_up,
        now=at,
        **kw,
    )


def keys(store: Store, name: str) -> list[str]:
    """The idempotency keys of the schedule's jobs, oldest slot first, read from the jobs
    table itself; each names exactly one job."""
    with store.transaction(durable=False) as tx:
        rows = tx.query(
            "SELECT idempotency_key, COUNT(*) FROM jobs WHERE idempotency_key LIKE ? "
            "GROUP BY idempotency_key ORDER BY idempotency_key",
            (f"schedule:{name}:%",),
        )
    assert all(n == 1 for _, n in rows), rows
    return [k for k, _ in rows if k.startswith(f"schedule:{name}:")]


def test_each_slot_fires_one_job_keyed_by_the_slot(store: Store, tmp_path: Path) -> None:
    clock = Clock(T0 + 0.5)
    every(store, "tick", tmp_path, at=clock.t)
    scheduler = Scheduler(store, REGISTRY, clock=clock)
    assert scheduler.tick().fired == []  # no slot after the anchor yet
    clock.t = T0 + 3.2
    fired = scheduler.tick().fired
    assert [f.slot for f in fired] == [
        "2026-12-02T02:00:01Z",
        "2026-12-02T02:00:02Z",
        "2026-12-02T02:00:03Z",
    ]
    assert all(f.created for f in fired)
    assert scheduler.tick().fired == []  # the same instant again: nothing new
    clock.t = T0 + 4.0
    assert [f.slot for f in scheduler.tick().fired] == ["2026-12-02T02:00:04Z"]
    assert keys(store, "tick") == [f"schedule:tick:2026-12-02T02:00:0{i}Z" for i in (1, 2, 3, 4)]
    runs = list_runs(store, "tick")
    assert [r["slot"] for r in runs] == [f"2026-12-02T02:00:0{i}Z" for i in (4, 3, 2, 1)]
    job = store.get_job(runs[0]["job_id"])
    assert job.submitted_by == "schedule:tick" and job.status == "pending"
    assert get_schedule(store, "tick").last_slot == T0 + 4
    # the jobs run, each effect once, each job verifies
    rt = Runtime(store=store, tools=REGISTRY)
    assert rt.run_until_idle() == 4
    assert sorted(e["job"] for e in effects(tmp_path)) == sorted(r["job_id"] for r in runs)
    for r in runs:
        assert store.get_job(r["job_id"]).status == "completed"
        assert verify_job(store, r["job_id"]).ok


def test_one_scheduler_at_a_time_holds_the_lease(store: Store, tmp_path: Path) -> None:
    clock = Clock(T0 + 0.5)
    every(store, "lease", tmp_path, at=clock.t)
    first = Scheduler(store, REGISTRY, owner="first", lease_seconds=5, clock=clock)
    second = Scheduler(store, REGISTRY, owner="second", lease_seconds=5, clock=clock)
    clock.t = T0 + 1.1
    assert len(first.tick().fired) == 1
    clock.t = T0 + 2.1
    busy = second.tick()
    assert busy.busy and busy.fired == []  # the first holds a live lease
    assert [f.slot for f in first.tick().fired] == ["2026-12-02T02:00:02Z"]
    clock.t = T0 + 8.0  # the first's lease (until 2.1 + 5) ran out: it died
    taken = second.tick()
    assert not taken.busy
    assert [f.slot[-3:] for f in taken.fired] == [f"{i:02d}Z" for i in range(3, 9)]
    clock.t = T0 + 9.0
    assert first.tick().busy  # the second's lease now
    second.release()  # (a worker that stops gives it up)
    assert [f.slot[-3:] for f in first.tick().fired] == ["09Z"]
    assert keys(store, "lease") == [f"schedule:lease:2026-12-02T02:00:0{i}Z" for i in range(1, 10)]


def test_a_slot_whose_job_exists_is_not_fired_again(store: Store, tmp_path: Path) -> None:
    """A scheduler that died between a slot's job and recording the slot: the next one gets
    the slot's job back, not a second one."""
    clock = Clock(T0 + 0.5)
    every(store, "crash", tmp_path, at=clock.t)
    before, _ = submit_agent_job(
        store,
        "sched_agent",
        {"dir": str(tmp_path)},
        tools=REGISTRY,
        idempotency_key="schedule:crash:2026-12-02T02:00:01Z",
        submitted_by="schedule:crash",
    )
    clock.t = T0 + 1.5
    fired = Scheduler(store, REGISTRY, clock=clock).tick().fired
    assert [(f.job_id, f.created) for f in fired] == [(before.job_id, False)]
    assert keys(store, "crash") == ["schedule:crash:2026-12-02T02:00:01Z"]


def test_schedulers_racing_for_one_slot_make_one_job(store_url: str, tmp_path: Path) -> None:
    """Exactly once does not rest on the lease: schedulers that each believe they hold it (a
    lease lost mid-tick) and submit the same slot at once get one job between them."""
    setup = open_store(store_url)
    row = every(setup, "race", tmp_path, at=T0)
    setup.close()
    stores = [open_store(store_url) for _ in range(4)]
    got: list[Any] = []
    gate = threading.Barrier(len(stores))

    def fire(s: Store) -> None:
        gate.wait()
        got.append(Scheduler(s, REGISTRY)._submit(row, T0 + 1))

    threads = [threading.Thread(target=fire, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(got) == 4
        assert len({f.job_id for f in got}) == 1
        assert sum(f.created for f in got) == 1
        assert keys(stores[0], "race") == ["schedule:race:2026-12-02T02:00:01Z"]
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize(
    ("mode", "fired", "skipped"),
    [("all", MAX_CATCH_UP, 250 - MAX_CATCH_UP), ("latest", 1, 249), ("none", 0, 250)],
)
def test_catch_up_decides_the_slots_missed_while_no_scheduler_ran(
    store: Store,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    fired: int,
    skipped: int,
) -> None:
    clock = Clock(T0)
    every(store, "away", tmp_path, at=clock.t, catch_up=mode, period="10m")
    last = T0 + 250 * 600
    clock.t = last + 70.0  # 250 slots missed, the last 70 s ago (late for `none`)
    with caplog.at_level(logging.WARNING, "affidavit.scheduler"):
        tick = Scheduler(store, REGISTRY, clock=clock).tick()
    assert len(tick.fired) == fired
    assert tick.skipped == {"away": skipped}
    assert f"missed {skipped} slot(s)" in caplog.text
    assert [f.slot for f in tick.fired][-1:] == ([iso_slot(last)] if fired else [])
    if fired:
        assert tick.fired[0].slot == iso_slot(last - (fired - 1) * 600)
    row = get_schedule(store, "away")
    assert (row.last_slot, row.skipped) == (last, skipped)
    assert len(keys(store, "away")) == fired
    clock.t = last + 601.0  # back on time: the next slot fires in every mode
    assert [f.slot for f in Scheduler(store, REGISTRY, clock=clock).tick().fired] == [
        iso_slot(last + 600)
    ]


def test_catch_up_none_fires_a_slot_that_is_on_time(store: Store, tmp_path: Path) -> None:
    clock = Clock(T0)
    every(store, "prompt", tmp_path, at=clock.t, catch_up="none", period="10m")
    clock.t = T0 + 3 * 600 + 59.0  # two slots missed, the third 59 s ago: on time
    tick = Scheduler(store, REGISTRY, clock=clock).tick()
    assert [f.slot for f in tick.fired] == [iso_slot(T0 + 1800)]
    assert tick.skipped == {"prompt": 2}


def test_a_paused_schedule_fires_nothing_and_resumes_from_now(store: Store, tmp_path: Path) -> None:
    clock = Clock(T0)
    every(store, "nap", tmp_path, at=clock.t, period="10s")
    scheduler = Scheduler(store, REGISTRY, clock=clock)
    assert set_paused(store, "nap", True).paused
    clock.t = T0 + 100
    assert scheduler.tick().fired == []
    set_paused(store, "nap", False, now=clock.t)
    assert scheduler.tick().fired == []  # slots missed while paused never fire
    clock.t = T0 + 110
    assert [f.slot for f in scheduler.tick().fired] == ["2026-12-02T02:01:50Z"]
    with pytest.raises(ScheduleNotFound):
        set_paused(store, "nope", True)


def test_a_schedule_whose_agent_the_scheduler_lacks_waits_with_its_error(
    store: Store, tmp_path: Path
) -> None:
    clock = Clock(T0)
    every(store, "lost", tmp_path, at=clock.t, period="1m")
    clock.t = T0 + 60.5
    lacking = Scheduler(store, ToolRegistry([]), clock=clock)
    tick = lacking.tick()
    assert tick.fired == [] and "not registered" in tick.errors["lost"]
    row = get_schedule(store, "lost")
    assert row.last_slot is None and "sched_agent" in (row.last_error or "")
    clock.t = T0 + 62.0
    again = lacking.tick()  # it leaves the schedule to the others for a while
    assert (again.busy, again.errors, again.fired) == (False, {}, [])
    # it gave the lease up: a scheduler with the agent fires the slot at once
    fired = Scheduler(store, REGISTRY, clock=clock).tick().fired
    assert [f.slot for f in fired] == ["2026-12-02T02:01:00Z"]
    assert get_schedule(store, "lost").last_error is None


def test_a_plan_schedule_fires_the_plan_kept_at_add(store: Store, tmp_path: Path) -> None:
    plan = tmp_path / "mark.yaml"
    plan.write_text(
        "name: marked\nnodes:\n  - id: m\n    type: tool\n    tool: sched_mark\n"
        "    args: {dir: '${input.dir}'}\n"
    )
    clock = Clock(T0)
    add_schedule(
        store,
        "planned",
        check_timing("*/5 * * * *", None, "Europe/Berlin"),
        plan=plan,
        tools=REGISTRY,
        input={"dir": str(tmp_path)},
        now=clock.t,
    )
    plan.unlink()  # the schedule keeps the plan itself
    clock.t = T0 + 301
    fired = Scheduler(store, ToolRegistry([]), clock=clock).tick().fired
    assert [f.slot for f in fired] == ["2026-12-02T02:05:00Z"]
    assert store.get_job(fired[0].job_id).plan_name == "marked"
    Runtime(store=store, tools=REGISTRY).run_until_idle()
    assert store.get_job(fired[0].job_id).status == "completed"
    assert verify_job(store, fired[0].job_id).ok
    assert [e["job"] for e in effects(tmp_path)] == [fired[0].job_id]


def test_runs_list_only_the_schedules_own_jobs(store: Store, tmp_path: Path) -> None:
    clock = Clock(T0)
    for name in ("a", "a.b", "a_b", "ab"):
        every(store, name, tmp_path, at=clock.t, period="1m")
    clock.t = T0 + 60
    assert len(Scheduler(store, REGISTRY, clock=clock).tick().fired) == 4
    for name in ("a", "a.b", "a_b", "ab"):
        assert [r["idempotency_key"] for r in list_runs(store, name)] == [
            f"schedule:{name}:2026-12-02T02:01:00Z"
        ]
    delete_schedule(store, "a")
    with pytest.raises(ScheduleNotFound):
        list_runs(store, "a")
    assert len(keys(store, "a")) == 1  # its jobs stay


@pytest.mark.parametrize(
    ("timing", "target", "error", "says"),
    [
        (("61 * * * *", None, None), {}, ConfigError, "invalid cron expression"),
        (("0 2 * * *", None, "Mars/Base"), {}, ConfigError, "unknown time zone"),
        ((None, "1s", "UTC"), {}, ConfigError, "--timezone goes with --cron"),
        ((None, None, None), {}, ConfigError, "give --cron or --every"),
        ((None, "1w", None), {}, ConfigError, "--every"),
        ((None, "1s", None), {"agent": "nope"}, PlanError, "not registered"),
        ((None, "1s", None), {"input": {"other": 1}}, PlanError, "does not fit"),
        ((None, "1s", None), {"name": "-x"}, ConfigError, "invalid schedule name"),
        ((None, "1s", None), {"name": "x:y"}, ConfigError, "invalid schedule name"),
        ((None, "1s", None), {"queue": "a b"}, ConfigError, "invalid queue name"),
        ((None, "1s", None), {"catch_up": "some"}, ConfigError, "unknown --catch-up"),
        ((None, "1s", None), {"input": {"dir": "x" * 300_000}}, ConfigError, "at most"),
    ],
)
def test_a_bad_schedule_is_refused_and_nothing_is_written(
    store: Store,
    tmp_path: Path,
    timing: tuple[Any, Any, Any],
    target: dict[str, Any],
    error: type[Exception],
    says: str,
) -> None:
    every(store, "kept", tmp_path, at=T0)
    given = {"agent": "sched_agent", "input": {"dir": str(tmp_path)}, "name": "new"} | target
    with pytest.raises(error, match=says):
        add_schedule(
            store,
            given.pop("name"),
            check_timing(*timing),
            tools=REGISTRY,
            now=T0,
            **given,
        )
    assert [r.name for r in list_schedules(store)] == ["kept"]


def test_a_name_in_use_is_refused(store: Store, tmp_path: Path) -> None:
    first = every(store, "twice", tmp_path, at=T0, period="1m")
    with pytest.raises(ConfigError, match="exists") as caught:
        every(store, "twice", tmp_path, at=T0 + 5, period="1h")
    assert "delete" in (caught.value.hint or "")
    assert get_schedule(store, "twice") == first
