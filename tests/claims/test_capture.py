"""Output capture: whatever the chunking, the digest and length cover the whole stream, the kept
text is the stream itself when it fits, and its head and tail when it does not."""

from __future__ import annotations

import hashlib
import itertools

from hypothesis import given
from hypothesis import strategies as st

from affidavit.claims.capture import Capture


@given(
    data=st.binary(max_size=600),
    cap=st.integers(min_value=2, max_value=200),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
    limit=st.integers(min_value=2, max_value=300),
)
def test_capture_keeps_head_and_tail_and_hashes_everything(
    data: bytes, cap: int, cuts: list[int], limit: int
) -> None:
    capture = Capture(cap)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for start, end in itertools.pairwise(bounds):
        capture.feed(data[start:end])
    got = capture.result()
    assert got.total_bytes == len(data)
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert len(got.head) + len(got.tail) <= cap
    if len(data) <= cap:
        assert not got.truncated and got.head + got.tail == data
    else:
        assert got.truncated
        assert data.startswith(got.head) and data.endswith(got.tail)
        assert len(got.head) == cap - cap // 2 and len(got.tail) == cap // 2
    excerpt = got.excerpt(limit)
    if len(data) <= min(cap, limit):
        assert excerpt == data.decode("utf-8", errors="replace")
    else:
        assert "bytes omitted" in excerpt
