"""One seal per job in the transparency log, first wins: the operator who holds every key and
the database rewrites a sealed job (every time a day back), re-chains and re-seals it with the
real seal key and tries to log the new seal. The store and the sequencer refuse; past dropped
guards, `verify` names it (`seal_superseded`, `log_duplicate`), and `log verify`, `pack verify`
and `disclose verify` refuse the second leaf wherever they can read the leaves before it.
Witness cosignature times show when the forged seal first existed. Both backends, real keys,
real subprocesses and HTTP on loopback."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.core.canonical import canonical
from affidavit.core.checkpoint import Checkpoint, TlogProof
from affidavit.core.events import utc_now
from affidavit.core.merkle import leaf_hash, new_nodes, root_from, root_nodes
from affidavit.core.note import COSIGNATURE_V1, NoteSigner, Verifier, parse_note, sign_note
from affidavit.core.seal import Seal, events_root, log_leaf, sign_seal
from affidavit.core.signing import SigningKey
from affidavit.packs import export_pack, verify_pack
from affidavit.packs._tlog import TLOG_PROOF
from affidavit.record._sealing import default_key_path
from affidavit.store import QueuedLeaf, open_store
from affidavit.tlog import LogKey, Sequencer, TransparencyLog, default_log_key_path
from affidavit.tlog._disclose import build_disclosure, encode_disclosure
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, json_of
from tests.tlog.helpers import drop_guards
from tests.tlog.test_log_cli import _jobs
from tests.verify.helpers import RawDb

ORIGIN = "test.example/log"
T1 = 1_900_000_000  # the witness's first cosignature (size 3)
T2 = T1 + 2 * 86400  # its second, after the forged leaf (size 4)


def _day_back(at: str) -> str:
    moved = datetime.fromisoformat(at.replace("Z", "+00:00")) - timedelta(days=1)
    return moved.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _rewrite(url: str, job_id: str) -> Seal:
    """Every event time of the job a day back, the log re-chained; a new seal over it signed by
    the real seal key, its ``sealed_at`` a day back too (not stored: the caller tries)."""
    raw = RawDb(url)
    events = []
    for _, event_id, event_type, payload, _ in raw.events(job_id):
        value = json.loads(payload)
        if isinstance(value.get("at"), str):
            value["at"] = _day_back(value["at"])
        events.append((event_id, event_type, canonical(value)))
    raw.rewrite_log(job_id, events)
    hashes = [bytes.fromhex(h) for *_, h in raw.events(job_id)]
    (sealed_at,) = raw.rows("SELECT sealed_at FROM seals WHERE job_id = ?", (job_id,))[0]
    return sign_seal(
        SigningKey.load(default_key_path(url)).private,
        job_id=job_id,
        event_count=len(hashes),
        event_chain_root_hash=hashes[-1].hex(),
        sealed_at=_day_back(sealed_at),
        events_root=events_root(hashes),
    )


def _store_seal(url: str, seal: Seal) -> int:
    return RawDb(url).execute(
        "UPDATE seals SET sealed_at = ?, event_chain_root_hash = ?, events_root = ?, "
        "signature = ? WHERE job_id = ?",
        (seal.sealed_at, seal.event_chain_root_hash, seal.events_root, seal.signature,
         seal.job_id),
    )  # fmt: skip


def _append_directly(url: str, job_id: str, leaf: bytes) -> int:
    """Append ``leaf`` to the tree as the store writes a batch, past the sequencer's check, and
    sign the new checkpoint with the real log key; its index."""
    store = open_store(url)
    try:
        signer = LogKey(default_log_key_path(url)).signer(ORIGIN)
        now = time.time()
        with store.transaction() as tx:
            assert tx.tlog_take_lease("operator", now, now + 60)
            size = tx.tlog_state().size
            frontier = tx.tlog_nodes(root_nodes(size))
            created = new_nodes(size, [leaf_hash(leaf)], frontier)
            root = root_from(size + 1, {**frontier, **created})
            assert tx.tlog_commit_batch(
                owner="operator", old_size=size, batch=[QueuedLeaf(0, job_id, leaf, now)],
                nodes=created, checkpoint=sign_note(Checkpoint(ORIGIN, size + 1, root).text(),
                signer), now=now, created_at=utc_now(),
            )  # fmt: skip
            tx.tlog_release_lease("operator")
        return size
    finally:
        store.close()


def _cosign(url: str, witness: NoteSigner, at: int) -> None:
    store = open_store(url)
    try:
        log = TransparencyLog(store)
        note = parse_note(log.checkpoint())
        signed = note.with_signatures([witness.sign(note.text, timestamp=at)]).encode()
        assert log.add_cosignature(signed, witness.verifier.vkey())
    finally:
        store.close()


def _integrate(url: str) -> Verifier:
    store = open_store(url)
    try:
        key = LogKey(default_log_key_path(url))
        Sequencer(store, key, origin=ORIGIN).integrate()
        return key.verifier(ORIGIN)
    finally:
        store.close()


def test_the_store_and_the_sequencer_refuse_a_second_leaf(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = _jobs(store_url, 3)
    _integrate(store_url)
    target = jobs[1]
    forged = _rewrite(store_url, target)
    raw = RawDb(store_url)
    # the store refuses to change or delete a logged seal
    with pytest.raises(Exception, match="cannot change"):
        _store_seal(store_url, forged)
    with pytest.raises(Exception, match="cannot change"):
        raw.execute("DELETE FROM seals WHERE job_id = ?", (target,))
    # the forged leaf queued, beside an honest job's and a leaf claiming another job's id
    (honest,) = _jobs(store_url, 1)
    raw.execute(
        "INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES (?, ?, ?), (?, ?, ?)",
        (target, log_leaf(forged), time.time(), "someone-else", log_leaf(forged), time.time()),
    )
    store = open_store(store_url)
    try:
        with caplog.at_level(logging.WARNING, logger="affidavit.tlog._sequencer"):
            done = Sequencer(store, LogKey(default_log_key_path(store_url))).integrate()
        assert (done.integrated, done.size) == (1, 4)
        assert done.rejected == ((target, "duplicate", 1), ("someone-else", "malformed", None))
        assert any(target in r.getMessage() for r in caplog.records)
        with store.snapshot() as snap:
            assert snap.tlog_queue_length() == 0
            assert [x.job_id for x in snap.tlog_leaves(0, 10)] == [*jobs, honest]
            assert [x.leaf for x in snap.tlog_leaves_of(target, 2)] == [
                log_leaf(store.get_seal(target))  # type: ignore[arg-type]
            ]
        # the store itself refuses a batch that repeats a job, past the sequencer's check
        with pytest.raises(Exception, match="already holds a leaf"):
            _append_directly(store_url, target, log_leaf(forged))
        result = verify_job(store, target)  # the seal stayed: the rewritten log fails it
        assert not result.ok and "chain root" in result.seal.error and result.seal.codes == ()
    finally:
        store.close()
    listed = cli("log", "rejected", "--db", store_url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json_of(listed)["rejected"]
    assert [(r["job_id"], r["reason"], r["first_index"]) for r in rows] == [
        ("someone-else", "malformed", None),
        (target, "duplicate", 1),
    ]
    assert json.loads(rows[1]["leaf"])["seal_sha256"] == json.loads(log_leaf(forged))["seal_sha256"]
    assert "duplicate  job " + target in cli("log", "rejected", "--db", store_url).stdout


@dataclass
class Rewritten:
    url: str
    api: str
    api_key: str
    jobs: list[str]
    target: str  # leaf 1; its forged second leaf is leaf 3
    forged: Seal
    log_vkey: Verifier
    witness: NoteSigner
    honest_pack: Path  # exported before the rewrite
    forged_proof: Path  # the proof of the forged leaf, as the operator can make it
    tmp: Path


@pytest.fixture
def rewritten(
    store_url: str,
    served: tuple[str, str],
    tmp_path: Path,
) -> Iterator[Rewritten]:
    api, api_key = served
    jobs = _jobs(store_url, 3)
    log_vkey = _integrate(store_url)
    witness = NoteSigner("w.example/w1", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
    _cosign(store_url, witness, T1)
    target = jobs[1]
    store = open_store(store_url)
    try:
        honest_pack = export_pack(store, target, tmp_path / "before").pack_dir
    finally:
        store.close()

    forged = _rewrite(store_url, target)
    drop_guards(store_url)
    assert _store_seal(store_url, forged) == 1
    index = _append_directly(store_url, target, log_leaf(forged))
    assert index == 3
    _cosign(store_url, witness, T2)  # a consistent append: the witness cosigns
    store = open_store(store_url)
    try:
        log = TransparencyLog(store)
        proof = TlogProof(index, tuple(log.inclusion(index, 4)), log.checkpoint(), log_leaf(forged))
    finally:
        store.close()
    forged_proof = tmp_path / "forged.tlog-proof"
    forged_proof.write_text(proof.encode())
    yield Rewritten(store_url, api, api_key, jobs, target, forged, log_vkey, witness,
                    honest_pack, forged_proof, tmp_path)  # fmt: skip


def test_verify_names_a_superseded_seal_and_a_second_leaf(rewritten: Rewritten) -> None:
    url, target = rewritten.url, rewritten.target
    one = cli("verify", target, "--db", url, "--json")
    assert one.returncode == 1, one.stdout + one.stderr
    seal = json_of(one)["seal"]
    assert seal["ok"] is False and seal["codes"] == ["seal_superseded", "log_duplicate"]
    assert "leaves 1 and 3" in seal["error"]
    human = cli("verify", target, "--db", url)
    assert human.returncode == 1 and "seal_superseded" in human.stdout + human.stderr
    every = cli("verify", "--all", "--db", url)
    assert every.returncode == 1 and target in every.stdout + every.stderr
    others = [cli("verify", j, "--db", url) for j in rewritten.jobs if j != target]
    assert [r.returncode for r in others] == [0, 0]
    auth = {"Authorization": f"Bearer {rewritten.api_key}"}
    body = httpx.get(f"{rewritten.api}/api/jobs/{target}/verify", headers=auth).json()
    assert body["ok"] is False and body["seal"]["codes"] == ["seal_superseded", "log_duplicate"]


def test_log_verify_refuses_the_second_leaf_and_shows_when_it_was_cosigned(
    rewritten: Rewritten,
) -> None:
    r = rewritten
    vkey, wkey = r.log_vkey.vkey(), r.witness.verifier.vkey()
    proof = str(r.forged_proof)
    # the proof alone verifies, and says what it did not prove
    alone = cli("log", "verify", proof, "--key", vkey, "--witness-key", wkey, "--json")
    assert alone.returncode == 0, alone.stderr
    shown = json_of(alone)
    assert shown["first_for_job"] is None and "not proven" in shown["first_checked"]
    assert shown["earliest_cosigned"]["unix"] == T2
    assert shown["earliest_cosigned"]["tree_size"] == 4
    text = cli("log", "verify", proof, "--key", vkey, "--witness-key", wkey).stdout
    assert "first leaf for the job: not proven" in text
    stamp = datetime.fromtimestamp(T2, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"earliest cosigned: {stamp} by w.example/w1" in text
    # the leaves before it, from the log's tiles or from the store: leaf 1 is the job's
    fetched = cli("log", "verify", proof, "--key", vkey, "--log-url", r.api)
    assert fetched.returncode == 1 and "log_duplicate" in fetched.stderr, fetched.stderr
    assert "leaf 1 is" in fetched.stderr
    by_db = cli("log", "verify", proof, "--key", vkey, "--job", r.target, "--db", r.url)
    assert by_db.returncode == 1 and "log_duplicate" in by_db.stderr, by_db.stderr
    # the job's own proof is its first leaf, which is not its (replaced) seal
    (r.tmp / "served.tlog-proof").write_text(cli("log", "proof", r.target, "--db", r.url).stdout)
    stale = cli("log", "verify", str(r.tmp / "served.tlog-proof"), "--key", vkey,
                "--job", r.target, "--db", r.url)  # fmt: skip
    assert stale.returncode == 1 and "not the job's seal" in stale.stderr
    # an honest job: first, and cosigned at the first checkpoint that covers it (size 3, T1),
    # though the proof's checkpoint is the newer one
    honest = r.jobs[2]
    (r.tmp / "honest.tlog-proof").write_text(cli("log", "proof", honest, "--db", r.url).stdout)
    ok = cli("log", "verify", str(r.tmp / "honest.tlog-proof"), "--key", vkey, "--witness-key",
             wkey, "--job", honest, "--db", r.url, "--json")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    verdict = json_of(ok)
    assert verdict["tree_size"] == 4 and verdict["first_for_job"] is True
    assert verdict["earliest_cosigned"] == {
        "at": datetime.fromtimestamp(T1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "unix": T1,
        "witness": "w.example/w1",
        "tree_size": 3,
    }
    assert verdict["sealed_at"].endswith("Z")
    over_http = cli("log", "verify", str(r.tmp / "honest.tlog-proof"), "--key", vkey,
                    "--log-url", r.api, "--json")  # fmt: skip
    assert over_http.returncode == 0 and json_of(over_http)["first_for_job"] is True
    # the forged seal claims a day before the honest one; a witness saw it two days later
    forged_at = datetime.fromisoformat(r.forged.sealed_at.replace("Z", "+00:00"))
    assert forged_at.timestamp() < T2


def test_packs_and_disclosures_of_the_second_leaf_fail(rewritten: Rewritten) -> None:
    r = rewritten
    wkeys = [r.witness.verifier]
    # a pack exported before the rewrite holds the first leaf: it verifies, leaves read
    before = verify_pack(r.honest_pack, log_key=r.log_vkey, witness_keys=wkeys, log_url=r.api)
    assert before.verdict == "MATCH", before.errors
    assert before.details["transparency_log"]["first_for_job"] is True
    # exported now, the pack's seal is the forged one and its proof the first leaf
    store = open_store(r.url, read_only=True)
    try:
        now = export_pack(store, r.target, r.tmp / "after").pack_dir
        events = store.list_events(r.target)
    finally:
        store.close()
    assert "not the job's seal" in " ".join(verify_pack(now, log_key=r.log_vkey).errors)
    # with the forged leaf's proof: only reading the leaves before it tells
    shutil.copy(r.forged_proof, now / TLOG_PROOF)
    alone = verify_pack(now, log_key=r.log_vkey, witness_keys=wkeys)
    assert alone.verdict == "MATCH" and alone.details["transparency_log"]["first_for_job"] is None
    out = cli("pack", "verify", str(now), "--out-dir", str(r.tmp / "v"), "--log-key",
              r.log_vkey.vkey(), "--log-url", r.api, "--json")  # fmt: skip
    assert out.returncode == 2 and json_of(out)["verdict"] == "INTEGRITY_FAIL", out.stdout
    details = json.loads(Path(json_of(out)["details_path"]).read_text())
    assert "log_duplicate" in json.dumps(details)
    # a disclosure of the forged seal with the forged leaf's proof
    doc = build_disclosure(r.forged, events, "a", r.forged_proof.read_text())
    path = r.tmp / "forged.disclosure.json"
    path.write_bytes(encode_disclosure(doc))
    seal_key = base64.b64encode(SigningKey.load(default_key_path(r.url)).public_raw).decode()
    base = ("disclose", "verify", str(path), "--key", seal_key, "--log-key", r.log_vkey.vkey())
    unproven = cli(*base)  # the proof alone cannot tell, and says so
    assert unproven.returncode == 0 and "first leaf for the job: not proven" in unproven.stdout
    caught = cli(*base, "--log-url", r.api)
    assert caught.returncode == 1 and "log_duplicate" in caught.stderr, caught.stderr
