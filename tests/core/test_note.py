"""Signed notes, checkpoints, cosignatures and tlog-proofs: the C2SP examples as vectors, and
every malformation rejected."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.core.checkpoint import Checkpoint, TlogProof, open_checkpoint, verify_tlog_proof
from affidavit.core.merkle import MemoryTree, ProofError, leaf_hash
from affidavit.core.note import (
    COSIGNATURE_V1,
    MAX_NOTE_BYTES,
    NoteError,
    NoteSigner,
    Signature,
    open_note,
    parse_note,
    parse_vkey,
    sign_note,
)

# c2sp.org/signed-note, "Verifier keys / Example"
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n— example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
# golang.org/x/mod/sumdb/note's example (the key pair is published with it)
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT
    + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2p"
    + "ZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def _go_signer() -> NoteSigner:
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])[1:]
    return NoteSigner("PeterNeumann", Ed25519PrivateKey.from_private_bytes(seed))


def test_spec_example_verifies() -> None:
    v = parse_vkey(SPEC_VKEY)
    assert v.vkey() == SPEC_VKEY
    note, verified = open_note(SPEC_NOTE, [v])
    assert note.text == "This is an example message.\n"
    assert verified == [v]


def test_go_example_signs_byte_for_byte() -> None:
    signer = _go_signer()
    assert signer.verifier.vkey() == GO_VKEY
    assert sign_note(GO_TEXT, signer) == GO_NOTE
    open_note(GO_NOTE, [parse_vkey(GO_VKEY)])


def test_bad_signature_rejected() -> None:
    v = parse_vkey(SPEC_VKEY)
    with pytest.raises(NoteError, match="does not verify"):
        open_note(SPEC_NOTE.replace("example message", "example massage"), [v])


def test_unknown_key_rejected_and_ignored() -> None:
    with pytest.raises(NoteError, match="no signature"):
        open_note(SPEC_NOTE, [parse_vkey(GO_VKEY)])
    # a signature by an unknown key beside a good one is ignored
    other = NoteSigner("example.com/foo", Ed25519PrivateKey.generate())
    note = parse_note(SPEC_NOTE)
    text = note.with_signatures([other.sign(note.text)]).encode()
    _, verified = open_note(text, [parse_vkey(SPEC_VKEY)])
    assert len(verified) == 1


@pytest.mark.parametrize(
    "bad",
    [
        "no blank line\n— a AAAAAAAA\n",
        "text\n\n— example.com/foo not*base64\n",
        "text\n\n- example.com/foo AAAAAAAA\n",
        "text\n\n— example.com/foo AAAAAAAA",
        "text\n\n— exa+mple AAAAAAAA\n",
        "te\x07xt\n\n— example.com/foo AAAAAAAA\n",
        "text\r\n\n— example.com/foo AAAAAAAA\n",
        "text\n\n— example.com/foo AAA=\n",
    ],
    ids=[
        "no_blank",
        "bad_base64",
        "no_dash",
        "no_final_newline",
        "plus_in_name",
        "bell",
        "cr",
        "short",
    ],
)
def test_malformed_notes_rejected(bad: str) -> None:
    with pytest.raises(NoteError):
        open_note(bad, [parse_vkey(SPEC_VKEY)])


def test_oversized_and_non_utf8_rejected() -> None:
    with pytest.raises(NoteError, match="bytes, more than"):
        parse_note("x" * MAX_NOTE_BYTES + SPEC_NOTE)
    with pytest.raises(NoteError, match="UTF-8"):
        parse_note(b"\xff\xfe\n\n" + SPEC_NOTE.encode())


@pytest.mark.parametrize(
    "bad",
    [
        "example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2",
        "example.com/foo+530d903a",
        "example.com/fo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
        "example.com/foo+530d903a+AukyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
    ],
)
def test_malformed_vkeys_rejected(bad: str) -> None:
    with pytest.raises(NoteError):
        parse_vkey(bad)


def _checkpoint(tree: MemoryTree, signer: NoteSigner) -> str:
    return sign_note(Checkpoint(signer.name, tree.size, tree.root()).text(), signer)


def test_spec_checkpoint_parses() -> None:
    text = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    cp = Checkpoint.from_text(text)
    assert (cp.origin, cp.size) == ("example.com/behind-the-sofa", 20852163)
    assert cp.text() == text
    for bad in [
        "o\n012\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
        "o\n12\nCsUYapGG\n",
        "o\n12\n",
        "o\n12\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n",
    ]:
        with pytest.raises(NoteError):
            Checkpoint.from_text(bad)


def test_cosigned_tlog_proof_round_trip() -> None:
    log = NoteSigner("log.example/test", Ed25519PrivateKey.generate())
    w1 = NoteSigner("w1.example", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
    w2 = NoteSigner("w2.example", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
    tree = MemoryTree()
    leaves = [f"leaf {i}".encode() for i in range(13)]
    tree.append(leaves)
    note = parse_note(_checkpoint(tree, log))
    cosigned = note.with_signatures([w1.sign(note.text, timestamp=1_700_000_000)]).encode()
    proof = TlogProof(5, tuple(tree.inclusion_proof(5)), cosigned, extra=b"job-5")
    parsed = TlogProof.parse(proof.encode())
    assert parsed == proof
    cp, witnesses = verify_tlog_proof(
        parsed, leaf_hash(leaves[5]), log.verifier, [w1.verifier, w2.verifier], min_witnesses=1
    )
    assert cp.size == 13 and witnesses == [w1.verifier]
    with pytest.raises(NoteError, match="1 valid witness cosignature"):
        verify_tlog_proof(
            parsed, leaf_hash(leaves[5]), log.verifier, [w1.verifier, w2.verifier], min_witnesses=2
        )
    with pytest.raises(ProofError):
        verify_tlog_proof(parsed, leaf_hash(leaves[6]), log.verifier)
    with pytest.raises(NoteError, match="not signed by the log"):
        other = NoteSigner("log.example/test", Ed25519PrivateKey.generate())
        verify_tlog_proof(parsed, leaf_hash(leaves[5]), other.verifier, [w1.verifier])
    with pytest.raises(NoteError, match="no signature"):
        verify_tlog_proof(parsed, leaf_hash(leaves[5]), other.verifier)
    # a cosignature over another timestamp than the one it carries fails the whole note
    sig = w1.sign(note.text, timestamp=5)
    forged = Signature(sig.name, sig.key_id, (6).to_bytes(8, "big") + sig.signature[8:])
    with pytest.raises(NoteError, match="does not verify"):
        open_checkpoint(note.with_signatures([forged]).encode(), log.verifier, [w1.verifier])


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t.replace("c2sp.org/tlog-proof@v1", "c2sp.org/tlog-proof@v2"),
        lambda t: t.replace("index 5", "index 05"),
        lambda t: t.replace("index 5", "idx 5"),
        lambda t: t.replace("\n\n", "\n", 1),
        lambda t: t.replace("index 5\n", "index 5\nnot-a-hash\n"),
        lambda t: t.replace("extra ", "extra !"),
    ],
    ids=["header", "leading_zero", "no_index", "no_blank", "bad_hash", "bad_extra"],
)
def test_malformed_tlog_proofs_rejected(mangle: object) -> None:
    log = NoteSigner("log.example/test", Ed25519PrivateKey.generate())
    tree = MemoryTree()
    tree.append([b"a", b"b", b"c", b"d", b"e", b"f", b"g"])
    text = TlogProof(5, tuple(tree.inclusion_proof(5)), _checkpoint(tree, log), b"x").encode()
    assert callable(mangle)
    with pytest.raises(NoteError):
        TlogProof.parse(mangle(text))


def test_vkeys_with_plus_in_their_base64() -> None:
    # transparency-dev/formats' note tests: a type 0x01 key whose base64 holds a '+', and a
    # cosigner key (type 0x04)
    plus = parse_vkey("TEST+7997405c+AQcC+FTVKf0jlTdHDY3rbevmnKxxPjigCXlVtGe6RIr6")
    assert plus.vkey() == "TEST+7997405c+AQcC+FTVKf0jlTdHDY3rbevmnKxxPjigCXlVtGe6RIr6"
    cosigner = parse_vkey("remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2")
    assert cosigner.sig_type == COSIGNATURE_V1
