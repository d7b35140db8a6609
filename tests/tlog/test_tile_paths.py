"""Tile paths a tree of at most 2**63 - 1 leaves cannot have, or not in the spec's one encoding,
are refused with 400 (c2sp.org/tlog-tiles), over real HTTP on both backends — never an
overflow in the store's query (a 500)."""

from __future__ import annotations

import httpx

TOO_FAR = [
    "0/x001/x002/" + "x999/" * 27 + "001",
    "entries/x001/x002/" + "x999/" * 27 + "001",
    "entries/" + "x999/" * 30 + "001.p/3",
    "entries/x036/x028/x797/x018/x963/968",  # 2**55: its first leaf is index 2**63
    "0/x036/x028/x797/x018/x963/967",  # its last leaf would be index 2**63 - 1
    "1/x140/x737/x488/x355/328",
    "7/001",
]
MALFORMED = ["0/x000/001", "entries/x000/000", "0/1", "64/000", "0/000.p/256", "0/000.p/0"]


def test_tile_paths_past_any_tree_are_400(served: tuple[str, str]) -> None:
    url, _ = served
    for path in TOO_FAR + MALFORMED:
        answer = httpx.get(f"{url}/log/tile/{path}")
        assert answer.status_code == 400, (path, answer.status_code, answer.text)
        assert answer.json()["error"]["code"] == "log_error", path
    # the last tiles a tree of 2**63 - 1 leaves could have: not in this log
    for path in ["entries/x036/x028/x797/x018/x963/966", "0/x036/x028/x797/x018/x963/966"]:
        assert httpx.get(f"{url}/log/tile/{path}").status_code == 404, path
