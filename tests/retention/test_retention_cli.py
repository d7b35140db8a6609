"""Tags and retention from the command line, on both backends: ``submit --tag``, ``jobs list
--tag``, ``retention set|show|run|hold|release``, ``verify`` of an archived job, ``verify
--all``, ``jobs list --archived``, and a worker that applies the policy on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from affidavit.store import open_store
from tests.cli.test_cli import SRC, cli, json_of
from tests.retention.helpers import finished_jobs

AGENT_TOOLS = str(Path(__file__).resolve().parents[1] / "runtime" / "agent_tools.py")


def test_tags_from_the_command_line(store_url: str) -> None:
    def submit(*tags: str) -> str:
        args = [a for t in tags for a in ("--tag", t)]
        done = cli("submit", "--agent", "refund_agent", "--tools", AGENT_TOOLS, *args,
                   "--input", '{"order_id": "A-1"}', "--db", store_url, "--json")  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json_of(done)["job_id"])

    gold = submit("plan=gold", "region=eu")
    submit("plan=silver", "region=eu")
    listed = json_of(cli("jobs", "list", "--tag", "plan=gold", "--db", store_url, "--json"))
    assert [j["job_id"] for j in listed] == [gold]
    assert listed[0]["tags"] == {"plan": "gold", "region": "eu"}
    both = cli("jobs", "list", "--tag", "region=eu", "--tag", "plan=gold", "--db", store_url)
    assert gold in both.stdout and both.stdout.count("refund_agent") == 1
    shown = json_of(cli("jobs", "show", gold, "--db", store_url, "--json"))
    assert shown["tags"] == {"plan": "gold", "region": "eu"}
    bad = cli("submit", "--agent", "refund_agent", "--tools", AGENT_TOOLS, "--tag", "no equals",
              "--db", store_url, "--json")  # fmt: skip
    assert bad.returncode == 3 and json_of(bad)["error"]["code"] == "invalid_tags"
    assert len(json_of(cli("jobs", "list", "--db", store_url, "--json"))) == 2


def test_retention_commands(store_url: str, tmp_path: Path) -> None:
    kept, archived = finished_jobs(store_url, 2)
    db = ("--db", store_url)
    unset = cli("retention", "run", *db, "--json")
    assert unset.returncode == 3 and "no retention policy" in unset.stdout
    both = cli("retention", "set", "--finished-older-than", "0s", "--archive", str(tmp_path),
               "--no-archive", *db)  # fmt: skip
    assert both.returncode == 3 and "exactly one of" in both.stderr
    bad_age = cli("retention", "set", "--finished-older-than", "90 days", "--no-archive", *db)
    assert bad_age.returncode == 3 and "not an age" in bad_age.stderr
    archive = tmp_path / "archive"
    done = cli("retention", "set", "--finished-older-than", "0s", "--archive", str(archive), *db)
    assert done.returncode == 0, done.stderr
    assert cli("retention", "hold", kept, "--reason", "case 7", *db).returncode == 0
    shown = json_of(cli("retention", "show", *db, "--json"))
    assert shown["policy"] == {
        "finished_older_than": "0s",
        "finished_older_than_s": 0,
        "archive": str(archive),
    }
    assert shown["due_now"] == 1 and shown["kept"]["held"] == 1
    assert [h["job_id"] for h in shown["holds"]] == [kept]

    ran = cli("retention", "run", *db, "--json")
    assert ran.returncode == 0, ran.stderr
    assert json_of(ran)["jobs"] == {archived: str(archive / f"pack-{archived}.tar.gz")}

    verified = cli("verify", archived, *db, "--json")
    assert verified.returncode == 0, verified.stdout
    doc = json_of(verified)
    assert (doc["status"], doc["ok"], doc["pack_present"]) == ("archived", True, True)
    assert doc["pack_path"] == str(archive / f"pack-{archived}.tar.gz")
    human = cli("verify", archived, *db)
    assert human.returncode == 0 and "archived" in human.stdout
    every = cli("verify", "--all", *db, "--json")
    assert every.returncode == 0 and json_of(every)["orphans"] == []
    assert [j["job_id"] for j in json_of(cli("jobs", "list", *db, "--json"))] == [kept]
    gone = json_of(cli("jobs", "list", "--archived", *db, "--json"))
    assert [t["job_id"] for t in gone] == [archived]
    assert json_of(cli("retention", "show", *db, "--json"))["archived"] == 1
    shown = cli("jobs", "show", archived, *db, "--json")
    assert shown.returncode == 2 and "was archived at" in json_of(shown)["error"]["message"]

    pack = archive / f"pack-{archived}.tar.gz"
    pack.write_bytes(pack.read_bytes()[:-8])  # the pack changed after it was archived
    broken = cli("verify", archived, *db, "--json")
    assert broken.returncode == 1 and "no longer matches" in json_of(broken)["problems"][0]
    assert cli("retention", "release", kept, *db).returncode == 0


def test_a_worker_applies_the_policy(store_url: str, tmp_path: Path) -> None:
    ids = finished_jobs(store_url, 2)
    assert cli("retention", "set", "--finished-older-than", "0s", "--archive", str(tmp_path),
               "--db", store_url).returncode == 0  # fmt: skip
    env = {**os.environ, "PYTHONPATH": SRC, "AFFIDAVIT_RETENTION_INTERVAL": "0.1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", "--db", store_url],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = open_store(store_url)
    try:
        deadline = time.monotonic() + 90
        while store.list_jobs() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.1)
        assert store.list_jobs() == [], "the worker's retention removed nothing"
        assert sorted(p.name for p in tmp_path.glob("pack-*")) == sorted(
            f"pack-{j}.tar.gz" for j in ids
        )
    finally:
        store.close()
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert json.loads(cli("verify", ids[0], "--db", store_url, "--json").stdout)["ok"]
