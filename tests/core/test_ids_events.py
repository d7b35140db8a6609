"""Identifiers and event payload models."""

from __future__ import annotations

import os
import re
import threading
import uuid

import pytest

from affidavit.core.errors import InvalidEventError
from affidavit.core.events import EventType, utc_now, validate_payload
from affidavit.core.ids import new_event_id, new_job_id, uuid7
from affidavit.core.payloads import PAYLOAD_MODELS


def test_uuid7_layout() -> None:
    u = uuid7()
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    assert uuid.UUID(new_job_id()).version == 7
    assert re.fullmatch(r"[0-9a-f]{32}", new_event_id())


def test_ids_are_unique_and_time_ordered_across_threads() -> None:
    results: list[list[str]] = [[] for _ in range(4)]

    def work(out: list[str]) -> None:
        out.extend(new_event_id() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for r in results for i in r]
    assert len(set(everything)) == len(everything)
    for r in results:  # each thread sees strictly increasing ids
        assert r == sorted(r)
        assert len(set(r)) == len(r)


def test_utc_now_format() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", utc_now())


def test_every_event_type_has_a_model() -> None:
    assert set(PAYLOAD_MODELS) == set(EventType)


def test_valid_payload() -> None:
    model = validate_payload(
        "node_finished",
        {
            "at": utc_now(),
            "node_id": "n",
            "step_id": "s",
            "result_type": "pure",
            "output": {"x": 1},
            "attempt": 1,
            "duration_ms": 2,
        },
    )
    assert model.at


@pytest.mark.parametrize(
    ("event_type", "payload", "fragment"),
    [
        ("teleported", {"at": "x"}, "unknown event type"),
        ("job_failed", {"error": "x"}, "at"),
        ("job_failed", {"at": "yesterday", "error": "x"}, "at"),
        (
            "node_finished",
            {
                "at": utc_now(),
                "node_id": "n",
                "step_id": "s",
                "result_type": "great",
                "attempt": 1,
                "duration_ms": 1,
            },
            "result_type",
        ),
        ("job_cancelled", {"at": utc_now(), "reason": None, "by": None, "extra": 1}, "extra"),
    ],
)
def test_invalid_payloads(event_type: str, payload: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        validate_payload(event_type, payload)
    assert fragment in info.value.message


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    """Random bits are drawn from the OS in blocks; a forked child must not replay the block
    its parent was in the middle of."""
    new_event_id()  # the parent now holds a partly used block
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        os.write(write_fd, " ".join(new_event_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write_fd)
    parent_ids = {new_event_id() for _ in range(50)}
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        child_ids = set(f.read().split())
    assert status == 0
    assert len(child_ids) == 50
    assert not parent_ids & child_ids
    # the low 62 bits are the random part: they must differ too, not just the counter
    assert not {i[-15:] for i in parent_ids} & {i[-15:] for i in child_ids}
