"""The transparency-log leaf of a seal: the vector of docs/formats.md."""

from __future__ import annotations

from affidavit.core.merkle import leaf_hash
from affidavit.core.seal import Seal, log_leaf, seal_sha256

SEAL = Seal(
    job_id="job-1",
    event_count=3,
    event_chain_root_hash="398d0016b9f62b0b37d824c4fd9502e3507204b21cd99f9f29235a787ec5a422",
    sealed_at="2026-01-01T00:00:00.000000Z",
    key_id="0123456789abcdef",
    signature="AAAA",
)


def test_leaf_vector() -> None:
    assert seal_sha256(SEAL) == "677382cc41d9123b864c8f344ccb2f722dcfbbea1fbf23321cea85c70c735625"
    assert log_leaf(SEAL) == (
        b'{"event_chain_root_hash":"398d0016b9f62b0b37d824c4fd9502e3507204b21cd99f9f29235a787ec5'
        b'a422","event_count":3,"job_id":"job-1","key_id":"0123456789abcdef","seal_sha256":"677'
        b'382cc41d9123b864c8f344ccb2f722dcfbbea1fbf23321cea85c70c735625","type":"affidavit.seal/v1"}'
    )
    assert (
        leaf_hash(log_leaf(SEAL)).hex()
        == "ea79514c110fda9c858cd359db826440b3ccb0b44f88b5bb813d40f4605299d7"
    )


def test_every_sealed_field_changes_the_leaf() -> None:
    import dataclasses

    base = log_leaf(SEAL)
    for field, value in [
        ("job_id", "job-2"),
        ("event_count", 4),
        ("event_chain_root_hash", "0" * 64),
        ("sealed_at", "2026-01-01T00:00:01.000000Z"),
        ("key_id", "fedcba9876543210"),
        ("signature", "BBBB"),
    ]:
        assert log_leaf(dataclasses.replace(SEAL, **{field: value})) != base, field
