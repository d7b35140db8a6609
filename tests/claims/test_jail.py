"""The bubblewrap jail: what a claim command can and cannot see. Real sandboxed commands on
both backends; each attack is one a served claim could try."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.claims import ClaimService, bwrap
from affidavit.claims.bwrap import SandboxUnavailable
from affidavit.record._sealing import SigningKey, default_key_path
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded


def service(store: Store, project: Path | None = None, **sandbox: object) -> ClaimService:
    svc = make_service(store, project=project, **sandbox)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    return svc


def stdout_of(svc: ClaimService, verification_id: str) -> str:
    evidence = svc.get_evidence(verification_id)
    assert evidence is not None
    return str(evidence["stdout"]["excerpt"]) + str(evidence["stderr"]["excerpt"])


@pytest.fixture
def key_file(store: Store) -> Path:
    """The service's signing key, created where the service keeps it."""
    path = default_key_path(store.url)
    SigningKey.load_or_create(path)
    assert b"PRIVATE KEY" in path.read_bytes()
    return path


def test_the_signing_key_is_unreadable_from_a_claim(store: Store, key_file: Path) -> None:
    svc = service(store)
    for command in (f"cat {key_file}", f"ls -la {key_file.parent}"):
        result = svc.verify_claim("alice", "custom", {"return_code": 0}, command, "vera")
        assert result.verdict == "inaccurate", command
        seen = stdout_of(svc, result.verification_id)
        assert "PRIVATE KEY" not in seen and "No such file" in seen


def test_the_database_is_unreadable_from_a_claim(store: Store) -> None:
    if store.backend != "sqlite":
        pytest.skip("PostgreSQL keeps no database file; its port is checked by the network test")
    db = store.url[len("sqlite:///") :].split("?", 1)[0]
    svc = service(store)
    result = svc.verify_claim("alice", "custom", {"return_code": 0}, f"ls {db}", "vera")
    assert result.verdict == "inaccurate"


def test_the_network_is_unreachable_from_a_claim(store: Store, project: Path) -> None:
    # PostgreSQL (the shared server on 127.0.0.1:5432) and every other service: no route.
    (project / "connect.py").write_text(
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 5432), timeout=5)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    svc = service(store, project)
    result = svc.verify_claim(
        "alice", "custom", {"output_contains": "refused"}, "python connect.py", "vera"
    )
    assert result.accurate, stdout_of(svc, result.verification_id)


def test_the_service_processes_and_environment_are_invisible(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFFIDAVIT_TEST_SECRET", "s3cr3t-value")
    svc = service(store)
    me = os.getpid()
    for command in (f"cat /proc/{me}/environ", "cat /proc/1/environ", "cat /proc/self/environ"):
        result = svc.verify_claim("alice", "custom", {}, command, "vera")
        seen = stdout_of(svc, result.verification_id)
        assert "s3cr3t-value" not in seen and "AFFIDAVIT" not in seen, command
    # Only the sandbox's own processes exist: its init and the command.
    result = svc.verify_claim("alice", "custom", {}, "ls /proc", "vera")
    pids = [w for w in stdout_of(svc, result.verification_id).split() if w.isdigit()]
    assert len(pids) <= 3 and str(me) not in pids


def test_the_command_runs_as_an_unprivileged_user_in_a_read_only_project(
    store: Store, project: Path
) -> None:
    (project / "write.py").write_text(
        "import os\n"
        "print('uid', os.getuid())\n"
        "try:\n"
        "    open('pwned', 'w')\n"
        "except OSError as exc:\n"
        "    print('read-only', exc.errno)\n"
    )
    svc = service(store, project)
    claim = {"output_contains": ["uid 65534", "read-only"]}
    result = svc.verify_claim("alice", "custom", claim, "python write.py", "vera")
    assert result.accurate, stdout_of(svc, result.verification_id)
    assert not (project / "pwned").exists()


def test_a_project_holding_the_signing_key_is_refused(store: Store, tmp_path: Path) -> None:
    # The tests keep the key under tmp_path/keys: a project of tmp_path would show it.
    svc = service(store, tmp_path)
    with pytest.raises(SandboxUnavailable, match="would show"):
        svc.verify_claim("alice", "custom", {}, "true", "vera")
    assert nothing_recorded(svc)


def test_without_bubblewrap_claims_are_refused_naming_the_package(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    svc = service(store)
    with pytest.raises(SandboxUnavailable, match="bubblewrap") as info:
        svc.verify_claim("alice", "custom", {}, "true", "vera")
    assert info.value.code == "sandbox_unavailable"
    assert bwrap.OPT_OUT_FLAG in info.value.hint
    assert nothing_recorded(svc)
    # The operator's explicit opt-out runs the command unsandboxed.
    unsafe = make_service(store, isolation="none")
    assert unsafe.verify_claim("alice", "custom", {}, "true", "vera").accurate


def test_a_hard_link_to_the_key_inside_the_project_is_refused(
    store: Store, project: Path, key_file: Path
) -> None:
    # The same file under another name: a path check alone would bind it.
    os.link(key_file, project / "notes.txt")
    svc = service(store, project)
    with pytest.raises(SandboxUnavailable, match="hard link") as info:
        svc.verify_claim("alice", "custom", {}, "cat notes.txt", "vera")
    assert "notes.txt" in info.value.message
    assert nothing_recorded(svc)


def test_a_hard_link_to_the_database_inside_the_project_is_refused(
    store: Store, project: Path
) -> None:
    if store.backend != "sqlite":
        pytest.skip("PostgreSQL keeps no database file the service could link")
    db = Path(store.url[len("sqlite:///") :].split("?", 1)[0])
    (project / "deep" / "er").mkdir(parents=True)
    os.link(db, project / "deep" / "er" / "data.bin")
    svc = service(store, project)
    with pytest.raises(SandboxUnavailable, match="hard link"):
        svc.verify_claim("alice", "custom", {}, "true", "vera")
    assert nothing_recorded(svc)


def test_a_hard_link_to_the_key_in_a_bound_directory_is_refused(
    store: Store, tmp_path: Path, key_file: Path
) -> None:
    # A search-path directory is bound but not walked: a key with a second name on its file
    # system may be inside, and is refused.
    tools = tmp_path / "tools"
    tools.mkdir()
    os.link(key_file, tools / "key-copy")
    svc = service(store, search_path=f"{tools}:/usr/bin:/bin")
    with pytest.raises(SandboxUnavailable, match="2 hard links"):
        svc.verify_claim("alice", "custom", {}, f"cat {tools}/key-copy", "vera")
    assert nothing_recorded(svc)
    # Once the extra name is gone, claims run again.
    (tools / "key-copy").unlink()
    assert svc.verify_claim("alice", "custom", {}, "true", "vera").accurate
