"""The shipped resource verifiers, one by one, against real files, a real HTTP server on
loopback and real SQL rows (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from affidavit import ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.runtime._confirm import (
    Confirmation,
    ConfirmationContext,
    Mismatch,
    ResourceVerifier,
    confirm_changes,
)
from affidavit.runtime._sdk import StateChange, ToolError
from affidavit.runtime._verifiers import (
    FileVerifier,
    HttpVerifier,
    SqlRowVerifier,
    file_version,
    record_file,
)
from tests.runtime.worlds import ResourceServer, SqlWorld

CTX = ConfirmationContext("job-1", "write", "step-1", "key-1", None)


def tool_ctx() -> ToolContext:
    return ToolContext("job-1", "write", "step-1", 1, "key-1", "affidavit:job-1:step-1:a")


# --- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sha256", "stat"])
def test_file_recorded_then_unchanged_changed_gone(tmp_path: Path, how: str) -> None:
    path = tmp_path / "out.txt"
    path.write_text("hello\n")
    ctx = tool_ctx()
    record_file(ctx, path, how=how)
    [change] = ctx.state_changes
    assert change.resource_type == "file" and change.resource_id == str(path.resolve())
    assert str(change.version).startswith(f"{how}:")
    v = FileVerifier()
    assert v.verify(CTX, change) == Confirmation.match()
    st = path.stat()
    path.write_text("HELLO!\n")  # another size, and content
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    changed = v.verify(CTX, change)
    assert not changed.ok and "changed" in changed.reason
    assert changed.observed == file_version(path, how) != change.version  # what it found now
    path.unlink()
    gone = v.verify(CTX, change)
    assert not gone.ok and "no longer exists" in gone.reason and gone.observed is None


def test_file_sha256_sees_a_same_size_edit_that_keeps_mtime(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("amount=100\n")
    st = path.stat()
    by_hash, by_stat = file_version(path), file_version(path, "stat")
    path.write_text("amount=900\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # forged mtime
    v = FileVerifier()
    assert not v.verify(CTX, StateChange("file", str(path), "write", by_hash)).ok
    # the cheaper stat check is fooled by this, as documented
    assert v.verify(CTX, StateChange("file", str(path), "write", by_stat)).ok


def test_file_delete_and_unrecognised_version(tmp_path: Path) -> None:
    path = tmp_path / "gone.txt"
    v = FileVerifier()
    deleted = StateChange("file", str(path), "delete")
    assert v.verify(CTX, deleted).ok
    path.write_text("back")
    again = v.verify(CTX, deleted)
    assert not again.ok and "exists again" in again.reason
    assert v.verify(CTX, StateChange("file", str(path), "write")).ok  # existence only
    odd = v.verify(CTX, StateChange("file", str(path), "write", "md5:abc"))
    assert not odd.ok and "unrecognised" in odd.reason
    with pytest.raises(ConfigError):
        file_version(path, "md5")


# --- HTTP -------------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ResourceServer]:
    with ResourceServer() as s:
        yield s


def test_http_etag(server: ResourceServer) -> None:
    url = f"{server.base}/orders/1"
    etag = httpx.put(url, json={"state": "paid"}).headers["etag"]
    v = HttpVerifier()
    change = StateChange("http", url, "update", etag=etag)
    assert v.verify(CTX, change).ok
    httpx.put(url, json={"state": "refunded"})
    changed = v.verify(CTX, change)
    assert not changed.ok and etag in changed.reason and "-v2" in changed.reason
    assert isinstance(changed.observed, str) and "-v2" in changed.observed
    httpx.delete(url)
    gone = v.verify(CTX, change)
    assert not gone.ok and "404" in gone.reason
    v.close()


def test_http_version_field(server: ResourceServer) -> None:
    url = f"{server.base}/orders/2"
    body = httpx.put(url, json={"state": "paid"}).json()
    v = HttpVerifier(version_field="version")
    change = StateChange("http", url, "update", version=body["version"])
    assert v.verify(CTX, change).ok
    httpx.put(url, json={"state": "refunded"})
    changed = v.verify(CTX, change)
    assert not changed.ok and "version recorded 1, now 2" in changed.reason
    assert changed.observed == 2
    nested = HttpVerifier(version_field="meta.rev")
    missing = nested.verify(CTX, change)
    assert not missing.ok and "no 'meta.rev' field" in missing.reason


def test_http_delete_and_unreachable(server: ResourceServer) -> None:
    url = f"{server.base}/orders/3"
    v = HttpVerifier(timeout=2)
    deleted = StateChange("http", url, "delete")
    assert v.verify(CTX, deleted).ok
    httpx.put(url, json={})
    assert not v.verify(CTX, deleted).ok
    # a port nobody listens on: what cannot be confirmed is a mismatch
    server.httpd.server_close()
    down = v.verify(CTX, StateChange("http", "http://127.0.0.1:9/x", "update", etag='"a"'))
    assert not down.ok and "could not be reached" in down.reason


# --- SQL rows ---------------------------------------------------------------------------------


@pytest.fixture
def world_url(store_url: str, tmp_path: Path) -> str:
    return store_url if store_url.startswith("postgresql") else f"sqlite:///{tmp_path}/w.db"


def test_sql_row_version(world_url: str) -> None:
    world = SqlWorld(world_url)
    ctx = tool_ctx()
    world.act(ctx)
    [change] = ctx.state_changes
    v = SqlRowVerifier(world_url, table="accounts")
    assert v.verify(CTX, change).ok
    world.change()
    changed = v.verify(CTX, change)
    assert not changed.ok and "version recorded 2" in changed.reason and "now 3" in changed.reason
    assert changed.observed == 3
    gone = v.verify(CTX, StateChange("sql_row", "acct-404", "update", version=1))
    assert not gone.ok and "no longer exists" in gone.reason
    assert v.verify(CTX, StateChange("sql_row", "acct-404", "delete")).ok
    assert not v.verify(CTX, StateChange("sql_row", "acct-1", "delete")).ok


def test_sql_row_refuses_bad_identifiers_and_urls(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    for bad in ("accounts; DROP TABLE x", 'a"b', "1table", "a.b.c", ""):
        with pytest.raises(ConfigError):
            SqlRowVerifier(url, table=bad)
    with pytest.raises(ConfigError):
        SqlRowVerifier(url, table="accounts", version_column="v--")
    with pytest.raises(ConfigError):
        SqlRowVerifier("mysql://x/y", table="accounts")


def test_sql_row_key_is_a_parameter_not_sql(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    SqlWorld(url)
    v = SqlRowVerifier(url, table="accounts")
    sneaky = StateChange("sql_row", "x' OR '1'='1", "update", version=1)
    assert not v.verify(CTX, sneaky).ok  # no row has that key
    with sqlite3.connect(f"{tmp_path}/w.db") as conn:
        assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (1,)


def test_sql_row_unreachable_database_is_a_mismatch(tmp_path: Path) -> None:
    v = SqlRowVerifier(f"sqlite:///{tmp_path}/missing.db", table="accounts")
    answer = v.verify(CTX, StateChange("sql_row", "acct-1", "update", version=1))
    assert not answer.ok and "could not be read" in answer.reason
    assert not (tmp_path / "missing.db").exists()  # read-only: nothing was created


# --- the protocol and the registry -------------------------------------------------------------


class Always:
    def __init__(self, answer: Confirmation, *types: str) -> None:
        self.answer = answer
        self.resource_types = types
        self.seen: list[StateChange] = []

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation:
        self.seen.append(change)
        return self.answer


def test_confirm_changes_asks_every_verifier_of_the_type() -> None:
    yes = Always(Confirmation.match(), "ticket")
    no = Always(Confirmation.mismatch("closed", observed="v4"), "ticket", "mail")
    other = Always(Confirmation.mismatch("never asked"), "file")
    registry = ToolRegistry(verifiers=[yes, no, other])
    assert isinstance(no, ResourceVerifier)
    changes: list[dict[str, Any]] = [
        {"resource_type": "ticket", "resource_id": "T-1", "operation": "update", "version": 3},
        {"resource_type": "unknown", "resource_id": "?", "operation": "update"},
    ]
    found = confirm_changes(registry.verifiers, CTX, changes)
    assert [(m.verifier, m.reason, m.resource["resource_id"]) for m in found] == [
        ("Always", "closed", "T-1")
    ]
    assert found[0].to_dict()["observed"] == "v4"  # recorded next to what the verifier saw
    assert "observed" not in Mismatch("n", "s", {}, "why", "V").to_dict()  # none: not written
    assert len(yes.seen) == len(no.seen) == 1 and not other.seen
    assert yes.seen[0] == StateChange("ticket", "T-1", "update", 3)


def test_registry_refuses_what_is_not_a_verifier() -> None:
    with pytest.raises(ToolError):
        ToolRegistry().add_verifier(object())  # type: ignore[arg-type]
    with pytest.raises(ToolError):
        ToolRegistry().add_verifier(Always(Confirmation.match()))  # no resource types
