"""Selective disclosure on both backends: a disclosed step verifies offline and shows nothing
else of its job; every tampering fails; a job rewritten and re-sealed by the operator is caught
by the transparency-log part; v1-sealed jobs keep verifying everywhere and refuse disclosure."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, verify_job
from affidavit.core.canonical import canonical
from affidavit.core.note import parse_vkey
from affidavit.core.seal import events_root, log_leaf, sign_seal
from affidavit.core.signing import SigningKey, default_key_path
from affidavit.packs import export_pack, verify_pack
from affidavit.record import Sealer
from affidavit.store import migrations, open_store
from affidavit.tlog import (
    MAX_DISCLOSURE_BYTES,
    LogKey,
    NotDisclosable,
    Sequencer,
    StepNotFound,
    disclose,
    encode_disclosure,
    verify_disclosure,
)
from tests.cli.test_cli import cli, json_of
from tests.runtime import agent_tools as at
from tests.store.legacy import undo_migration_12
from tests.tlog.helpers import drop_guards
from tests.verify.helpers import TWO_CHARGES, RawDb, reseal_v1, tools, waiting_job

ORIGIN = "test.example/log"


def _job(url: str) -> str:
    with Runtime(url, tools=tools()) as rt:
        job_id = rt.submit(TWO_CHARGES, {"amount": 7}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
    return job_id


def _seal_key(url: str) -> SigningKey:
    return SigningKey.load(default_key_path(url))


def _disclosed(url: str, job_id: str, step: str) -> bytes:
    store = open_store(url, read_only=True)
    try:
        return encode_disclosure(disclose(store, job_id, step))
    finally:
        store.close()


def _integrate(url: str) -> str:
    """Integrate the queued seals; the log's vkey."""
    store = open_store(url)
    try:
        log_key = LogKey(default_key_path(url).with_name("affidavit-log.key"))
        Sequencer(store, log_key, origin=ORIGIN).integrate()
        return log_key.verifier(ORIGIN).vkey()
    finally:
        store.close()


def test_a_step_discloses_verifies_and_shows_nothing_else(store_url: str) -> None:
    job_id = _job(store_url)
    data = _disclosed(store_url, job_id, "a")
    result = verify_disclosure(data, [_seal_key(store_url).public_raw])
    assert result.ok, result.error
    assert result.job_id == job_id and result.selector == "a"
    assert [e["type"] for e in result.events] == [
        "node_started",
        "tool_invocation_started",
        "tool_invocation_finished",
        "command_committed",
        "node_finished",
    ]
    assert {e["node_id"] for e in result.events} == {"a"}
    assert result.log == {"checked": False, "present": False}

    store = open_store(store_url, read_only=True)
    try:
        events = store.list_events(job_id)
        seal = store.get_seal(job_id)
    finally:
        store.close()
    assert seal is not None and seal.version == 2 and seal.event_count == len(events)
    shown = {e["version"] for e in result.events}
    text = data.decode()
    for event in events:
        if event.version in shown:
            assert event.event_id in text
            continue
        # no other event's id, payload bytes (raw or base64) or payload values
        assert event.event_id not in text
        assert event.payload_bytes.decode() not in text
        assert base64.b64encode(event.payload_bytes).decode() not in text
    assert '"amount":2' not in text  # step b's argument
    assert len(data) < 8192

    # one event by its version: the job's first (H_0 is empty)
    first = verify_disclosure(_disclosed(store_url, job_id, "1"), [_seal_key(store_url).public_raw])
    assert first.ok and [e["type"] for e in first.events] == ["job_created"]
    last = _disclosed(store_url, job_id, str(len(events)))
    assert verify_disclosure(last, [_seal_key(store_url).public_raw]).ok

    store = open_store(store_url, read_only=True)
    try:
        with pytest.raises(StepNotFound):
            disclose(store, job_id, "nope")
        with pytest.raises(StepNotFound):
            disclose(store, job_id, str(len(events) + 1))
    finally:
        store.close()


def _doc(data: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(data)
    return value


def _flip(hex_hash: str) -> str:
    raw = bytearray(bytes.fromhex(hex_hash))
    raw[5] ^= 0x01
    return raw.hex()


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def tamper(data: bytes) -> bytes:
        doc = _doc(data)
        change(doc)
        return canonical(doc)

    return tamper


def _flip_proof(doc: dict[str, Any]) -> None:
    proof = doc["events"][0]["proof"]
    proof[0] = _flip(proof[0])


def _other_proof(doc: dict[str, Any]) -> None:
    doc["events"][1]["proof"] = doc["events"][0]["proof"]


def _other_index(doc: dict[str, Any]) -> None:
    doc["events"][0]["version"] += 1
    doc["events"] = doc["events"][:1]


def _resigned_root(key: SigningKey) -> Callable[[dict[str, Any]], None]:
    """The operator's own key signing a seal whose events root is another tree's."""

    def change(doc: dict[str, Any]) -> None:
        seal = doc["seal"]
        doc["seal"] = sign_seal(
            key.private,
            job_id=seal["job_id"],
            event_count=seal["event_count"],
            event_chain_root_hash=seal["event_chain_root_hash"],
            sealed_at=seal["sealed_at"],
            events_root=events_root([b"\x00" * 32] * seal["event_count"]),
        ).to_dict()

    return change


def _tampers(key: SigningKey) -> dict[str, Callable[[bytes], bytes]]:
    def set_(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def change(doc: dict[str, Any]) -> None:
            *parents, last = path.split(".")
            target: Any = doc
            for p in parents:
                target = target[int(p)] if p.isdigit() else target[p]
            target[int(last) if last.isdigit() else last] = (
                value(target[last]) if callable(value) else value
            )

        return change

    return {
        "payload": _edit(set_("events.1.payload.tool_name", "refund_everything")),
        "payload field added": _edit(lambda d: d["events"][0]["payload"].update(x=1)),
        "event type": _edit(set_("events.0.type", "node_finished")),
        "event id": _edit(set_("events.0.event_id", "forged")),
        "previous chain hash": _edit(set_("events.2.previous_chain_hash", _flip)),
        "proof bit": _edit(_flip_proof),
        "proof shortened": _edit(lambda d: d["events"][0]["proof"].pop()),
        "proof of another event": _edit(_other_proof),
        "proof for another index": _edit(_other_index),
        "seal signature": _edit(set_("seal.signature", base64.b64encode(bytes(64)).decode())),
        "seal events_root": _edit(set_("seal.events_root", _flip)),
        "events_root re-signed": _edit(_resigned_root(key)),
        "seal event_count": _edit(set_("seal.event_count", lambda n: n + 1)),
        "seal of another job": _edit(set_("job_id", "another-job")),
        "seal made v1": _edit(lambda d: [d["seal"].pop("version"), d["seal"].pop("events_root")]),
        "selector": _edit(set_("selector", "b")),
        "no events": _edit(set_("events", [])),
        "unknown field": _edit(lambda d: d.update(extra=1)),
        "truncated": lambda data: data[: len(data) // 2],
        "garbage": lambda data: b"\x00\xff garbage",
        "empty": lambda data: b"",
        "not an object": lambda data: b"[1, 2, 3]",
        "duplicate key": lambda data: data[:-2] + b',"type":"affidavit.disclosure/v1"}',
        "oversized": lambda data: data + b" " * MAX_DISCLOSURE_BYTES,
        "too many events": _edit(lambda d: d.update(events=d["events"] * 300)),
        "proof too long": _edit(set_("events.0.proof", lambda p: p + [p[0]] * 70)),
    }


def test_every_tampering_fails(store_url: str) -> None:
    job_id = _job(store_url)
    key = _seal_key(store_url)
    data = _disclosed(store_url, job_id, "a")
    assert verify_disclosure(data, [key.public_raw]).ok
    for name, tamper in _tampers(key).items():
        result = verify_disclosure(tamper(data), [key.public_raw])
        assert not result.ok and result.error, f"{name}: verified"
    # the wrong key, and no key
    other = SigningKey.generate()
    wrong = verify_disclosure(data, [other.public_raw])
    assert not wrong.ok and "not a given --key" in wrong.error
    assert not verify_disclosure(data, []).ok


def test_verify_job_recomputes_the_events_root(store_url: str) -> None:
    """A v2 seal re-signed with the real key over another events root: the chain head and
    length still match, the recomputed events root does not."""
    job_id = _job(store_url)
    raw = RawDb(store_url)
    [(count, root, sealed_at)] = raw.rows(
        "SELECT event_count, event_chain_root_hash, sealed_at FROM seals WHERE job_id = ?",
        (job_id,),
    )
    forged = sign_seal(
        _seal_key(store_url).private, job_id=job_id, event_count=count,
        event_chain_root_hash=root, sealed_at=sealed_at, events_root="ab" * 32,
    )  # fmt: skip
    raw.execute(
        "UPDATE seals SET events_root = ?, signature = ? WHERE job_id = ?",
        (forged.events_root, forged.signature, job_id),
    )
    store = open_store(store_url, read_only=True)
    try:
        result = verify_job(store, job_id)
        assert not result.ok and "events_root" in result.seal.error
        with pytest.raises(Exception, match="does not match its seal's events root"):
            disclose(store, job_id, "a")
    finally:
        store.close()


def test_a_rewritten_and_resealed_job_is_caught_by_the_log_proof(store_url: str) -> None:
    job_id = _job(store_url)
    vkey = _integrate(store_url)
    key = _seal_key(store_url).public_raw
    honest = _disclosed(store_url, job_id, "a")
    checked = verify_disclosure(honest, [key], log_key=parse_vkey(vkey))
    assert checked.ok, checked.error
    assert checked.log is not None and checked.log["checked"] and checked.log["tree_size"] == 1

    # The operator drops the store's guards and the job's last event, and re-seals it with the
    # real seal key.
    drop_guards(store_url)
    raw = RawDb(store_url)
    last = raw.rows("SELECT max(version) FROM events WHERE job_id = ?", (job_id,))[0][0]
    raw.execute("DELETE FROM events WHERE job_id = ? AND version = ?", (job_id, last))
    raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    store = open_store(store_url)
    try:
        resealed = Sealer.for_store(store).seal_job(store, job_id)
        assert resealed is not None and resealed.event_count == last - 1
    finally:
        store.close()
    forged = _disclosed(store_url, job_id, "a")
    assert verify_disclosure(forged, [key]).ok  # the seal alone cannot tell
    caught = verify_disclosure(forged, [key], log_key=parse_vkey(vkey))
    assert not caught.ok and "not the job's seal" in caught.error
    # a file without its log proof is refused when a log key is given
    stripped = _doc(forged)
    stripped["tlog_proof"] = None
    refused = verify_disclosure(canonical(stripped), [key], log_key=parse_vkey(vkey))
    assert not refused.ok and "no transparency-log proof" in refused.error


def test_v1_sealed_jobs_verify_everywhere_and_refuse_disclosure(
    store_url: str, tmp_path: Path
) -> None:
    job_id = _job(store_url)
    reseal_v1(store_url, job_id)
    store = open_store(store_url)
    try:
        seal = store.get_seal(job_id)
        assert seal is not None and seal.version == 1 and seal.events_root is None
        assert "version" not in seal.to_dict()
        assert verify_job(store, job_id).ok
        with pytest.raises(NotDisclosable, match="v1 seal"):
            disclose(store, job_id, "a")
        exported = export_pack(store, job_id, tmp_path / "pack")
        assert exported is not None
    finally:
        store.close()
    verdict = verify_pack(tmp_path / "pack", trusted_keys=[_seal_key(store_url).public_raw])
    assert verdict.verdict == "MATCH", verdict.errors
    vkey = _integrate(store_url)
    proof = cli("log", "proof", job_id, "--db", store_url)
    (tmp_path / "job.proof").write_text(proof.stdout)
    logged = cli("log", "verify", str(tmp_path / "job.proof"), "--key", vkey,
                 "--job", job_id, "--db", store_url)  # fmt: skip
    assert logged.returncode == 0, logged.stderr
    assert cli("verify", job_id, "--db", store_url).returncode == 0
    refused = cli("disclose", job_id, "--step", "a", "--db", store_url, "--json")
    assert refused.returncode == 2
    error = json_of(refused)["error"]
    assert error["code"] == "not_disclosable" and "v1 seal" in error["message"]
    leaf = base64.b64decode((tmp_path / "job.proof").read_text().split("\n")[1][len("extra ") :])
    assert leaf == log_leaf(seal)  # the v1 seal's leaf, as before seal v2


def test_a_copy_made_before_migration_12_reads_every_seal_as_v1(store_url: str) -> None:
    job_id = _job(store_url)
    undo_migration_12(store_url)
    store = open_store(store_url, read_only=True)
    try:
        assert store.schema_version() == 11
        seal = store.get_seal(job_id)
        assert seal is not None and seal.version == 1
        assert verify_job(store, job_id).ok
    finally:
        store.close()
    store = open_store(store_url)  # the upgrade keeps the v1 seal as it is
    try:
        folder = "sqlite" if store.backend == "sqlite" else "postgres"
        assert store.schema_version() == migrations.load(folder)[-1].version
        assert verify_job(store, job_id).ok
    finally:
        store.close()


def test_an_agent_step_by_node_id_or_step_id(store_url: str) -> None:
    at.CALLS.clear()
    with Runtime(store_url, tools=at.registry(), lease_seconds=30) as rt:
        job_id = rt.submit(at.refund_agent, {"order_id": "A-1"}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        events = rt.store.list_events(job_id)
    key = _seal_key(store_url).public_raw
    [called] = [e for e in events if e.type == "step_called" and e.payload["seq"] == 2]
    by_node = verify_disclosure(_disclosed(store_url, job_id, "#2"), [key])
    by_step = verify_disclosure(_disclosed(store_url, job_id, called.payload["step_id"]), [key])
    assert by_node.ok and by_step.ok, (by_node.error, by_step.error)
    assert by_node.events == by_step.events
    assert by_node.events[0]["type"] == "step_called"
    assert {e["node_id"] for e in by_node.events} == {"#2"}


def test_cli_end_to_end(store_url: str, tmp_path: Path) -> None:
    job_id = _job(store_url)
    pub = json_of(cli("keys", "show", "--db", store_url, "--json"))["public_key"]
    (tmp_path / "seal.pub").write_text(pub + "\n")
    assert cli("log", "integrate", "--origin", ORIGIN, "--db", store_url).returncode == 0
    (tmp_path / "log.vkey").write_text(cli("log", "key", "--db", store_url).stdout)

    out = tmp_path / "step.json"
    made = cli("disclose", job_id, "--step", "b", "--out", str(out), "--db", store_url)
    assert made.returncode == 0, made.stderr
    stdout = cli("disclose", job_id, "--step", "b", "--db", store_url)
    assert stdout.returncode == 0 and stdout.stdout.encode() == out.read_bytes()
    assert json.loads(out.read_text())["tlog_proof"].startswith("c2sp.org/tlog-proof@v1\n")

    ok = cli("disclose", "verify", str(out), "--key", str(tmp_path / "seal.pub"),
             "--log-key", str(tmp_path / "log.vkey"))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert f"of step 'b' of job {job_id}" in ok.stdout
    assert f"leaf 0 of {ORIGIN} at checkpoint size 1" in ok.stdout
    doc = json_of(cli("disclose", "verify", str(out), "--key", pub, "--json"))
    assert doc["ok"] is True and doc["job_id"] == job_id and doc["log"]["checked"] is False
    assert [e["node_id"] for e in doc["events"]] == ["b"] * 5

    # not verified: exit 1, the first failure on stderr (or in the JSON)
    tampered = json.loads(out.read_text())
    tampered["events"][1]["payload"]["args_hash"] = "0" * 16
    (tmp_path / "bad.json").write_text(json.dumps(tampered))
    bad = cli("disclose", "verify", str(tmp_path / "bad.json"), "--key", pub)
    assert bad.returncode == 1 and "not verified: event" in bad.stderr
    bad_json = cli("disclose", "verify", str(tmp_path / "bad.json"), "--key", pub, "--json")
    assert bad_json.returncode == 1 and "not in the sealed log" in json_of(bad_json)["error"]
    other_key = base64.b64encode(SigningKey.generate().public_raw).decode()
    assert cli("disclose", "verify", str(out), "--key", other_key).returncode == 1
    assert cli("disclose", "verify", str(out), "--key", "nonsense").returncode == 3
    missing = cli("disclose", "verify", str(tmp_path / "none.json"), "--key", pub, "--json")
    assert missing.returncode == 3 and "cannot read" in json_of(missing)["error"]["message"]
    no_log = cli("disclose", "verify", str(out), "--key", pub, "--witness-key", "x+1+2")
    assert no_log.returncode == 3 and "needs --log-key" in no_log.stderr

    # refusals to disclose: exit 2 with a code
    def refusal(*args: str) -> dict[str, Any]:
        result = cli("disclose", *args, "--db", store_url, "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        error: dict[str, Any] = json_of(result)["error"]
        return error

    assert refusal("no-such-job", "--step", "a")["code"] == "job_not_found"
    assert refusal(job_id, "--step", "zz")["code"] == "step_not_found"
    with Runtime(store_url, tools=tools()) as rt:
        waiting = waiting_job(rt)
    unsealed = refusal(waiting, "--step", "a")
    assert unsealed["code"] == "not_disclosable" and "not sealed" in unsealed["message"]


def test_the_runtime_seals_its_events_root(store_url: str) -> None:
    """The seal of a job made by the runtime covers exactly its log (events root over the
    stored chain hashes), also when the job's last event was appended in the sealing
    transaction."""
    job_id = _job(store_url)
    store = open_store(store_url, read_only=True)
    try:
        seal = store.get_seal(job_id)
        hashes = [bytes.fromhex(e.chain_hash) for e in store.list_events(job_id)]
    finally:
        store.close()
    assert seal is not None and seal.events_root == events_root(hashes)
