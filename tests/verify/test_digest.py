"""The recorded-hash check against parsed values: the sorted-key bytes first, JCS on a miss."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest
import rfc8785

from affidavit.verify._digest import canonical_hash_matches


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "text",
    [
        b'{"b":1,"a":[true,null,"x"]}',
        b'{"amount":5.0,"fee":2.5}',  # JCS writes 5, orjson 5.0
        b'{"tiny":1e-7}',
        b'{"\xf0\x9f\x98\x80":1,"\xef\xac\x80":2}',  # keys sorted differently by UTF-16
        b"[]",
        b"9007199254740993",  # beyond 2^53: not representable in JCS
    ],
)
def test_jcs_and_sorted_key_hashes_match_nothing_else_does(text: bytes) -> None:
    value: Any = orjson.loads(text)
    try:
        jcs: bytes | None = bytes(rfc8785.dumps(value))
    except rfc8785.CanonicalizationError:
        jcs = None
    if jcs is not None:
        assert canonical_hash_matches(value, sha(jcs))
    assert canonical_hash_matches(value, sha(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)))
    assert not canonical_hash_matches(value, sha(text + b" "))
    assert not canonical_hash_matches(value, "0" * 64)
