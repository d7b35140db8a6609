"""The audit's reading of a tree from tlog-tiles, against an in-memory tree served over real
loopback HTTP: from any verified size to any larger one (aligned or not to tiles, across tile
levels), the entries and tiles fold to the signed root; a wrong root is refused; a repeat at
the far end of a big tree is found with its earlier leaf proved by the tiles."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.merkle import MemoryTree
from affidavit.core.note import sign_note
from affidavit.store.audit_index import job_key
from affidavit.tlog import EntriesMismatch, JobIndex, LogClient, LogKey, parse_tile_path
from affidavit.tlog._audit import Audit
from tests.cli.test_cli import cli
from tests.tlog.loopback import Answer, Served, serve
from tests.tlog.operator import resealed

ORIGIN = "test.example/log"
SIZE = 70_001  # 273 full bundles, three tile levels; the last leaf repeats job-0


def _leaf(i: int) -> bytes:
    doc = {
        "type": "affidavit.seal/v1",
        "job_id": f"job-{i}",
        "event_count": 2,
        "event_chain_root_hash": "a" * 64,
        "key_id": "b" * 16,
        "seal_sha256": "c" * 64,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


LEAVES = [_leaf(i) for i in range(SIZE - 1)]
LEAVES.append(resealed(LEAVES[0]))


class TreeLog:
    """Tiles and bundles of an in-memory tree of ``LEAVES`` (every width that exists), and its
    checkpoint at full size signed with ``key``."""

    def __init__(self, key: LogKey) -> None:
        self.tree = MemoryTree()
        self.tree.append(LEAVES)
        self.key = key

    def __call__(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        if path == "/log/checkpoint":
            text = Checkpoint(ORIGIN, SIZE, self.tree.root()).text()
            return 200, [sign_note(text, self.key.signer(ORIGIN)).encode()]
        tile = parse_tile_path(path.removeprefix("/log/tile/"))
        width = tile.width or 256
        first = tile.index * 256
        if tile.level is None:
            leaves = LEAVES[first : first + width]
            assert len(leaves) == width, path
            return 200, [b"".join(len(x).to_bytes(2, "big") + x for x in leaves)]
        hashes = [self.tree.nodes[(8 * tile.level, first + k)] for k in range(width)]
        return 200, [b"".join(hashes)]


@pytest.fixture(scope="module")
def tree_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TreeLog, Served]]:
    log = TreeLog(LogKey(tmp_path_factory.mktemp("keys") / "log.key"))
    with serve(log) as served:
        yield log, served


def _index(path: Path, start: int) -> JobIndex:
    index = JobIndex(path, ORIGIN)
    index.begin()
    for i in range(start):
        index.add(job_key(f"job-{i}"), i)
    index.commit(start)
    return index


GROWTHS = [(0, 1), (0, 257), (1, 2), (255, 257), (256, 512), (300, 301), (65_535, 65_537),
           (65_536, 70_000), (3, 70_000)]  # fmt: skip


@pytest.mark.parametrize(("start", "size"), GROWTHS)
def test_any_growth_folds_to_the_signed_root(
    tree_log: tuple[TreeLog, Served], tmp_path: Path, start: int, size: int
) -> None:
    log, served = tree_log
    index = _index(tmp_path / "jobs.sqlite", start)
    client = LogClient(served.url)
    progress: list[tuple[int, int]] = []
    try:
        audit = Audit(client, index, progress=lambda d, t: progress.append((d, t)))
        assert audit.run(Checkpoint(ORIGIN, size, log.tree.root(size))) == []
        index.commit(size)
        assert (index.size, index.count()) == (size, size)
        assert progress[-1] == (size - start, size - start)

        wrong = Checkpoint(ORIGIN, size + 1, log.tree.root(size))  # another tree's root
        with pytest.raises(EntriesMismatch):
            audit.run(wrong)
        assert (index.size, index.count()) == (size, size)
    finally:
        index.close()
        client.close()


def test_a_repeat_at_the_far_end_is_found_and_proved(
    tree_log: tuple[TreeLog, Served], tmp_path: Path
) -> None:
    log, served = tree_log
    index = _index(tmp_path / "jobs.sqlite", 65_536)
    client = LogClient(served.url)
    try:
        findings = Audit(client, index).run(Checkpoint(ORIGIN, SIZE, log.tree.root()))
        (finding,) = findings
        assert (finding.kind, finding.index, finding.earlier_index) == (
            "duplicate_job",
            SIZE - 1,
            0,
        )
        assert finding.job_id == "job-0" and finding.leaf == LEAVES[-1]
        assert finding.earlier_leaf == LEAVES[0]  # read back, proved against the root
        assert index.size == 65_536  # nothing committed
    finally:
        index.close()
        client.close()


def test_the_monitor_catches_up_a_big_log_with_progress(
    tree_log: tuple[TreeLog, Served], tmp_path: Path
) -> None:
    log, served = tree_log
    vkey = log.key.verifier(ORIGIN).vkey()
    done = cli("log", "monitor", "--log-url", served.url, "--log-key", vkey,
               "--state", str(tmp_path / "m"))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (record["kind"], record["index"], record["earlier_index"]) == (
        "duplicate_job",
        SIZE - 1,
        0,
    )
    progress = [line for line in done.stderr.splitlines() if line.startswith("monitor: ")]
    assert progress[0] == f"monitor: audited 10240 of {SIZE} new entries"
    assert progress[-1] == f"monitor: audited {SIZE} of {SIZE} new entries"
    assert len(progress) == 7
