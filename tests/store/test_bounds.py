"""Out-of-range paging values are a clear ConfigError on both backends, never a database error."""

from __future__ import annotations

import pytest

from affidavit import ConfigError, JobFilter, Store


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.list_events("j", after_version=2**64),
        lambda s: s.list_events("j", after_version=-1),
        lambda s: s.list_events("j", limit=0),
        lambda s: s.list_jobs(JobFilter(offset=2**63)),
        lambda s: s.list_jobs(JobFilter(limit=2**70)),
    ],
    ids=["after_version_huge", "after_version_negative", "limit_zero", "offset_huge", "limit_huge"],
)
def test_out_of_range_paging_is_refused(store: Store, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        call(store)


def test_nul_in_ids_and_filters_is_not_a_database_error(store: Store) -> None:
    from affidavit import JobNotFound

    with pytest.raises(JobNotFound):
        store.get_job("a\x00b")
    assert store.list_events("a\x00b") == []
    with pytest.raises(ConfigError):
        store.list_jobs(JobFilter(namespace="a\x00b"))
