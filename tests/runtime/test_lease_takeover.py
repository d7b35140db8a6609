"""Lease takeover: a worker that stalls inside a tool (GC pause, frozen VM, SIGSTOP) loses its
lease, a second worker reclaims the job — and the stale worker can commit nothing afterwards.

Fencing guards the record, not the world: what the stale worker does to the outside world after
the takeover still happens, and the side-channel counts below say so explicitly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import psycopg
import pytest

from affidavit import FencedError, Runtime, StoreError, Tool, ToolContext, ToolRegistry
from affidavit.runtime._worker import Worker
from affidavit.store import Store
from affidavit.store.postgres import split_url
from tests.conftest import PG_URL, with_schema
from tests.runtime.crash_tools import REGISTRY, counts, read_side
from tests.runtime.helpers import (
    assert_log_sound,
    ledger_rows,
    of_type,
    spawn_driver,
    wait_lease_expired,
    write_lock_free,
)


class FrozenHeartbeats:
    """The stalled worker's view of the store: its heartbeats do not get through (as if the
    whole process were frozen), everything else does. Records the errors its writes raise."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.errors: list[BaseException] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[Any]:
        try:
            with self._store.transaction(durable=durable) as tx:
                yield _NoHeartbeat(tx)
        except BaseException as exc:
            self.errors.append(exc)
            raise


class _NoHeartbeat:
    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def heartbeat(self, *args: Any, **kwargs: Any) -> bool:
        raise StoreError("heartbeat did not get through (worker frozen)")


@pytest.mark.parametrize(
    ("stall", "reconcile"),
    [("after_effect", True), ("before_effect", True), ("after_effect", False)],
    ids=["stall-after-effect", "stall-before-effect", "stall-after-effect-no-reconcile"],
)
def test_stale_worker_is_fenced_off(store_url: str, stall: str, reconcile: bool) -> None:
    world: list[tuple[str, str]] = []  # the outside world: (who, external key) per real effect
    stalled, release = threading.Event(), threading.Event()

    def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        who = threading.current_thread().name
        if who == "stale" and stall == "before_effect":
            stalled.set()
            release.wait(20)
        world.append((who, ctx.external_key))
        if who == "stale" and stall == "after_effect":
            stalled.set()
            release.wait(20)
        return {"paid": amount, "ref": ctx.external_key}

    def find(ctx: ToolContext, amount: int) -> dict[str, Any] | None:
        hits = [key for _, key in world if key == ctx.external_key]
        return {"paid": amount, "ref": hits[0]} if hits else None

    def note(ctx: ToolContext, paid: dict[str, Any]) -> dict[str, Any]:
        world.append((threading.current_thread().name, "note:" + paid["ref"]))
        return {"noted": paid["ref"]}

    tools = ToolRegistry(
        [
            Tool("pay", pay, "tool", reconcile_fn=find if reconcile else None),
            Tool("note", note, "tool"),
        ]
    )
    with Runtime(store_url, tools=tools, lease_seconds=5) as rt:
        job_id = rt.submit(
            {
                "nodes": [
                    {"id": "pay", "type": "tool", "tool": "pay", "args": {"amount": 7}},
                    {
                        "id": "note",
                        "type": "tool",
                        "tool": "note",
                        "args": {"paid": "${pay}"},
                        "depends_on": ["pay"],
                    },
                ]
            },
            {},
        ).job_id

        frozen = FrozenHeartbeats(rt.store)
        stale_worker = Worker(frozen, tools, worker_id="stale-worker", lease_seconds=0.5)  # type: ignore[arg-type]
        stale_result: list[str | None] = []
        stale = threading.Thread(
            target=lambda: stale_result.append(stale_worker.run_once(job_id)), name="stale"
        )
        stale.start()
        try:
            assert stalled.wait(10)
            stale_attempt = rt.get_job(job_id).attempt_id
            wait_lease_expired(rt.store, job_id)

            # The takeover: a second worker reclaims the job and finishes (or parks) it.
            fresh = Worker(rt.store, tools, worker_id="fresh-worker", lease_seconds=5)
            fresh_status = fresh.run_once(job_id)
            job = rt.get_job(job_id)
            assert job.attempt_id != stale_attempt or job.attempt_id is None
            events_after_takeover = rt.store.list_events(job_id)
            ledger_after_takeover = ledger_rows(rt.store, job_id)
        finally:
            release.set()
            stale.join(20)

        # The stale worker woke up, tried T2 and was fenced off: nothing it did was recorded.
        assert stale_result == ["lost"]
        assert any(isinstance(e, FencedError) for e in frozen.errors)
        assert rt.store.list_events(job_id) == events_after_takeover
        assert ledger_rows(rt.store, job_id) == ledger_after_takeover
        events = assert_log_sound(rt.store, job_id)
        after_claim = [e.payload["worker_id"] for e in events if e.type == "node_started"]
        assert after_claim[0] == "stale-worker"
        assert set(after_claim[1:]) <= {"fresh-worker"}  # nothing from the stale attempt
        finished = of_type(events, "tool_invocation_finished")
        stale_effects = [key for who, key in world if who == "stale"]
        fresh_effects = [key for who, key in world if who == threading.current_thread().name]
        [pay_row] = [r for r in ledger_rows(rt.store, job_id) if r.node_id == "pay"]
        if not reconcile:
            # Nobody can tell whether the stale call acted: parked, not re-run, not recorded.
            assert fresh_status == "parked" and rt.get_job(job_id).status == "parked"
            assert len(stale_effects) == 1 and fresh_effects == []
            assert pay_row.status == "started" and finished == []
            return
        assert fresh_status == "completed"
        job = rt.get_job(job_id)
        assert job.status == "completed"
        assert pay_row.status == "committed"
        if stall == "after_effect":
            # The stale call acted before it froze; the fresh worker's reconcile found it.
            assert len(stale_effects) == 1
            assert fresh_effects == ["note:" + stale_effects[0]]
            assert pay_row.result == {"paid": 7, "ref": stale_effects[0]}
            [caught] = [f for f in finished if f["node_id"] == "pay"]  # no stale T2
            assert caught["catch_up"] is True and caught["outcome"] == "success"
        else:
            # The stale call acted only after the takeover, when the fresh worker had already
            # found nothing and paid itself: the world saw two payments — fencing cannot undo
            # that — but the record holds exactly the fresh worker's, and only it.
            assert len(stale_effects) == 1
            assert fresh_effects[0] != stale_effects[0]
            assert fresh_effects == [fresh_effects[0], "note:" + fresh_effects[0]]
            assert pay_row.result == {"paid": 7, "ref": fresh_effects[0]}
            assert job.output == {"note": {"noted": fresh_effects[0]}}
            assert [f["outcome"] for f in finished if f["node_id"] == "pay"] == [
                "lost",
                "success",
            ]


def freeze(proc: subprocess.Popen[str], url: str, job_id: str) -> None:
    """SIGSTOP ``proc`` at a moment when it holds no lock (its heartbeat thread writes every
    lease/3 seconds: a process frozen inside that transaction would block the takeover)."""
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.02)  # let anything already sent reach the server first
        if write_lock_free(url, job_id):
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError("could not freeze the worker outside a transaction")


def test_sigstopped_worker_process_is_fenced_off(store_url: str, tmp_path: Path) -> None:
    """A real worker process is frozen with SIGSTOP right after its tool acted; its lease
    expires, the job is reclaimed and completed here; then it is thawed: its T2 is rejected
    and it ends with status "lost", having written nothing."""
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(
            {
                "nodes": [
                    {
                        "id": "pay",
                        "type": "tool",
                        "tool": "crash_slow_charge",
                        "args": {"side": "${input.side}", "amount": 5, "delay": 2.5},
                    }
                ]
            },
            {"side": str(side)},
        ).job_id
        proc = spawn_driver(store_url, "--job", job_id, "--lease", "0.5")
        try:
            end = time.monotonic() + 30
            while not read_side(side):  # the effect happened; the call sleeps before returning
                assert proc.poll() is None and time.monotonic() < end, proc.stderr
                time.sleep(0.005)
            freeze(proc, store_url, job_id)
            [line] = read_side(side)
            assert line["pid"] == proc.pid
            wait_lease_expired(rt.store, job_id)
            assert rt.run_until_idle() == 1
            job = rt.get_job(job_id)
            assert job.status == "completed"
            assert job.output == {"pay": {"charge_id": line["key"], "amount": 5}}
            snapshot = rt.store.list_events(job_id)
            ledger = ledger_rows(rt.store, job_id)
        finally:
            proc.send_signal(signal.SIGCONT)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["status"] == "lost"
        assert rt.store.list_events(job_id) == snapshot
        assert ledger_rows(rt.store, job_id) == ledger
        assert counts(side, "charge") == {(job_id, "pay"): 1}
        events = assert_log_sound(rt.store, job_id)
        [caught] = of_type(events, "tool_invocation_finished")
        assert caught["catch_up"] is True and caught["outcome"] == "success"


def freeze_idle_in_a_transaction(proc: subprocess.Popen[str], url: str, job_id: str) -> None:
    """SIGSTOP ``proc`` at a moment when one of its sessions (``application_name`` in ``url``)
    sits idle in a transaction that holds the job's row lock: the server waits for its next
    statement (a pause, a suspended VM or a partition can come at any moment)."""
    conninfo, _ = split_url(url)
    app = dict(parse_qsl(conninfo.partition("?")[2]))["application_name"]
    for _ in range(2000):
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.02)  # let anything already sent reach the server first
        if not write_lock_free(url, job_id):
            with psycopg.connect(PG_URL) as conn:
                states = {
                    row[0]
                    for row in conn.execute(
                        "SELECT state FROM pg_stat_activity WHERE application_name = %s", (app,)
                    )
                }
            if "idle in transaction" in states and "active" not in states:
                return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.003)
    raise AssertionError("could not freeze the worker idle in a transaction")


def test_a_worker_frozen_inside_a_transaction_does_not_hold_its_job_forever(
    pg_schema: str, tmp_path: Path
) -> None:
    """PostgreSQL: a worker process is frozen between two statements of a transaction that
    holds the job's row lock. Its lease runs out, but a claim skips a locked row (SKIP LOCKED)
    and a cancel waits for it: without a bound on a session idle in a transaction, the frozen
    process would keep the job from every other worker for as long as it stays frozen. The
    server ends that session, the job is reclaimed and completed, and the thawed worker
    writes nothing. (The frozen worker's URL sets the bound to 2 s instead of the default
    10 s, which tests/store/test_postgres_url.py checks: the wait is the bound's, not the
    test's.)"""
    url = with_schema(PG_URL, pg_schema)
    side = tmp_path / "side.jsonl"
    steps = [
        {
            "id": f"s{i:03}",
            "type": "tool",
            "tool": "crash_charge",
            "args": {"side": "${input.side}", "amount": i},
            **({"depends_on": [f"s{i - 1:03}"]} if i else {}),
        }
        for i in range(2000)  # (long enough for a freeze to land in a transaction)
    ]
    with Runtime(url, tools=REGISTRY, lease_seconds=30) as rt:
        job_id = rt.submit({"nodes": steps}, {"side": str(side)}).job_id
        bound = quote("-c idle_in_transaction_session_timeout=2000", safe="")
        frozen_url = f"{url}&application_name=frozen_{pg_schema}&options={bound}"
        proc = spawn_driver(frozen_url, "--job", job_id, "--lease", "0.5")
        try:
            end = time.monotonic() + 30
            while not read_side(side):
                assert proc.poll() is None and time.monotonic() < end, proc.stderr
                time.sleep(0.005)
            freeze_idle_in_a_transaction(proc, frozen_url, job_id)
            wait_lease_expired(rt.store, job_id)
            deadline = time.monotonic() + 30
            while (status := rt.worker.run_once(job_id)) is None:
                assert time.monotonic() < deadline, "the frozen worker still holds the job"
                time.sleep(0.2)
            assert status == "completed"
            snapshot = rt.store.list_events(job_id)
        finally:
            proc.send_signal(signal.SIGCONT)
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["status"] == "lost"
        assert rt.store.list_events(job_id) == snapshot
        assert_log_sound(rt.store, job_id)
        charges = [line for line in read_side(side) if line["kind"] == "charge"]
        per_node = counts(side, "charge")
        # The one effect no lease can prevent (docs/runtime.md): the freeze can land between
        # the frozen worker's lease confirmation and its tool's effect (the freeze waits for a
        # moment its heartbeat holds the job's row lock, whatever the tool thread is doing),
        # and on waking it acts once more — after everything the new owner did, under its own
        # attempt's external key. Any other second effect is a failure.
        last = charges[-1]
        doubled = {node: n for node, n in per_node.items() if n > 1}
        if doubled:
            assert doubled == {(last["job"], last["node"]): 2}, doubled
            first = next(c for c in charges if c["node"] == last["node"])
            assert first["key"] != last["key"]  # two attempts, the frozen one last
        assert set(per_node.values()) <= {1, 2}
        assert len(per_node) == len(steps)
