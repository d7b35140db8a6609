"""Property: any single byte changed in any stored payload of a finished job is detected (150
examples per backend; 2,000 with ``--soak``)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit import Runtime, verify_job
from tests.conftest import examples
from tests.verify.helpers import RawDb


@settings(
    max_examples=examples(150, 2000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_single_byte_change_is_detected(
    refunded: tuple[Runtime, str], raw: RawDb, data: st.DataObject
) -> None:
    rt, job_id = refunded
    events = raw.events(job_id)
    version, _, _, payload, _ = data.draw(st.sampled_from(events), label="event")
    position = data.draw(st.integers(0, len(payload) - 1), label="byte")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != payload[position]), label="value")
    changed = payload[:position] + bytes([new]) + payload[position + 1 :]
    raw.set_payload(job_id, version, changed)
    try:
        result = verify_job(rt.store, job_id)
        assert not result.ok
        assert not result.stored_chain.ok
        assert result.stored_chain.first_bad_version == version
    finally:
        raw.set_payload(job_id, version, payload)  # the next example starts from the original
    assert verify_job(rt.store, job_id).ok
