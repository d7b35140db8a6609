"""`affidavit verify` and `affidavit keys` as a user runs them, on both backends."""

from __future__ import annotations

import gc
import json
import os
import stat
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, verify_job
from affidavit.cli.verify_cmds import verify as verify_cmd
from affidavit.examples import refund
from affidavit.store._snapshot import SqlSnapshot
from affidavit.store.postgres import PostgresSnapshot
from affidavit.store.sqlite import SqliteSnapshot
from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import SECTION6_KEYS, TWO_CHARGES, RawDb, refund_job, tools

SECTION6 = set(SECTION6_KEYS)


def finished_job(url: str, tmp_path: Path, order_id: str = "A-1001") -> str:
    with Runtime(url, tools=refund.TOOLS) as rt:
        return refund_job(rt, tmp_path / f"shop-{order_id}", order_id)


def test_verify_outputs_and_exit_codes(store_url: str, tmp_path: Path) -> None:
    job_id = finished_job(store_url, tmp_path)

    ok = cli("verify", job_id, "--db", store_url, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json_of(ok)
    assert set(doc) == SECTION6 and doc["ok"] is True
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        assert doc == verify_job(rt.store, job_id).to_dict()

    human = cli("verify", job_id, "--db", store_url)
    assert human.returncode == 0
    assert "✓" in human.stdout and "✗" not in human.stdout
    assert "verified: every check holds" in human.stdout

    RawDb(store_url).execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    bad = cli("verify", job_id, "--db", store_url, "--json")
    assert bad.returncode == 1
    assert json_of(bad)["seal"] == {
        "present": False,
        "ok": False,
        "key_id": None,
        "event_count": None,
        "error": "the job is completed but has no seal",
        "codes": [],
    }
    bad_human = cli("verify", job_id, "--db", store_url)
    assert bad_human.returncode == 1
    assert "✗" in bad_human.stdout and "has no seal" in bad_human.stdout
    assert "NOT verified: seal failed" in bad_human.stdout

    missing = cli("verify", "no-such-job", "--db", store_url, "--json")
    assert missing.returncode == 2
    assert json_of(missing)["error"]["code"] == "job_not_found"

    bad_key = cli("verify", job_id, "--trusted-key", "AAAA", "--db", store_url, "--json")
    assert bad_key.returncode == 3
    assert json_of(bad_key)["error"]["code"] == "config_error"


def test_verify_all_reports_every_job_and_fails_on_any(store_url: str, tmp_path: Path) -> None:
    clean = finished_job(store_url, tmp_path, "A-1001")
    tampered = finished_job(store_url, tmp_path, "A-1002")
    unsealed = finished_job(store_url, tmp_path, "A-1003")
    raw = RawDb(store_url)
    version, _, _, payload, _ = raw.events(tampered)[3]
    raw.set_payload(tampered, version, payload.replace(b'"', b"'", 1))
    raw.execute("DELETE FROM seals WHERE job_id = ?", (unsealed,))

    result = cli("verify", "--all", "--db", store_url, "--json")
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""
    doc = json_of(result)
    assert result.stdout == as_emitted(doc)  # the results, spooled, are laid out as one document
    assert (doc["jobs"], doc["verified"], doc["failed"]) == (3, 1, 2)
    assert doc["failed_jobs"] == [unsealed, tampered]  # newest first
    by_id = {r["job_id"]: r for r in doc["results"]}
    assert list(by_id) == [unsealed, tampered, clean]
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        for job_id, entry in by_id.items():
            assert set(entry) == SECTION6
            assert entry == verify_job(rt.store, job_id).to_dict()
    assert by_id[tampered]["stored_chain"]["first_bad_version"] == version
    assert by_id[unsealed]["seal"]["present"] is False
    assert by_id[clean]["ok"] is True

    human = cli("verify", "--all", "--db", store_url)
    assert human.returncode == 1
    assert tampered in human.stdout and unsealed in human.stdout and clean not in human.stdout
    assert "stored_chain" in human.stdout and "has no seal" in human.stdout
    assert "NOT verified: 2 of 3 jobs failed a check" in human.stdout

    raw.set_payload(tampered, version, payload)  # repaired; `unsealed` stays without a seal
    narrowed = cli("verify", "--all", "--status", "failed", "--db", store_url, "--json")
    assert narrowed.returncode == 0, narrowed.stderr
    assert json_of(narrowed)["jobs"] == 0
    assert narrowed.stdout == as_emitted(json_of(narrowed))  # (no result at all)
    one = cli("verify", "--all", "--status", "failed", "--status", "completed", "--db", store_url,
              "--json")  # fmt: skip
    assert len(json_of(one)["results"]) == 3 and one.stdout == as_emitted(json_of(one))
    # a bad trusted key is an error even when no job is verified with it
    for bad in ("not-a-key", "0123456789abcdef"):  # malformed; a key id nothing records
        refused = cli("verify", "--all", "--status", "failed", "--trusted-key", bad,
                      "--db", store_url, "--json")  # fmt: skip
        assert refused.returncode == 3, refused.stdout
        assert json_of(refused)["error"]["code"] == "config_error"
    completed = cli("verify", "--all", "--status", "completed", "--db", store_url)
    assert completed.returncode == 1
    assert "NOT verified: 1 of 3 jobs failed a check" in completed.stdout


def as_emitted(doc: Any) -> str:
    """``doc`` as the CLI prints one JSON document."""
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def test_verify_selection_errors_change_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    for args in (
        (),
        ("some-job", "--all"),
        ("some-job", "--status", "completed"),
        ("some-job", "--namespace", "ns"),
        ("--all", "--status", "finished"),
    ):
        result = cli("verify", *args, "--db", url, "--json")
        assert result.returncode == 3, args
        assert json_of(result)["error"]["code"] == "config_error", args
    assert list(tmp_path.iterdir()) == []

    # a mistyped path is an error, not "every check holds for 0 jobs" (nor a new database)
    missing = cli("verify", "--all", "--db", url, "--json")
    assert missing.returncode == 3
    assert (
        json_of(missing)["error"]["message"]
        == f"no SQLite database at {str(tmp_path / 'never.db')!r}"
    )
    assert list(tmp_path.iterdir()) == []

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert cli("db", "migrate", "--db", empty).returncode == 0
    result = cli("verify", "--all", "--db", empty)
    assert result.returncode == 0
    assert "no jobs to verify" in result.stdout


def test_verify_store_error_is_exit_3(tmp_path: Path) -> None:
    result = cli("verify", "x", "--db", f"sqlite:///{tmp_path / 'no' / 'dir.db'}", "--json")
    assert result.returncode == 3
    assert json_of(result)["error"]["code"] == "store_error"


def test_keys_show_and_rotate(store_url: str, tmp_path: Path) -> None:
    key_file = Path(os.environ["AFFIDAVIT_SIGNING_KEY"])
    shown = cli("keys", "show", "--db", store_url, "--json")
    assert shown.returncode == 0, shown.stderr
    first = json_of(shown)
    assert first["path"] == str(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # showing registers nothing: the first key that seals registers itself
    assert (first["keys"], first["status"]) == ([], "unregistered")
    assert json_of(cli("keys", "show", "--db", store_url, "--json"))["key_id"] == first["key_id"]

    old_job = finished_job(store_url, tmp_path, "A-1001")
    shown = json_of(cli("keys", "show", "--db", store_url, "--json"))
    assert ([k["key_id"] for k in shown["keys"]], shown["status"]) == ([first["key_id"]], "active")
    rotated = cli("keys", "rotate", "--db", store_url, "--json")
    assert rotated.returncode == 0, rotated.stderr
    second = json_of(rotated)
    assert second["retired_key_id"] == first["key_id"] != second["key_id"]
    retired = {k["key_id"]: k["retired_at"] for k in second["keys"]}
    assert retired[first["key_id"]] is not None and retired[second["key_id"]] is None
    assert (key_file.parent / f"{key_file.name}.retired-{first['key_id']}").exists()

    new_job = finished_job(store_url, tmp_path, "A-1002")
    for job_id, key_id in ((old_job, first["key_id"]), (new_job, second["key_id"])):
        doc = json_of(cli("verify", job_id, "--db", store_url, "--json"))
        assert doc["ok"] is True and doc["seal"]["key_id"] == key_id

    human = cli("keys", "show", "--db", store_url)
    assert second["key_id"] in human.stdout and first["key_id"] in human.stdout


def test_keys_show_refuses_a_key_file_that_is_not_there(store_url: str, tmp_path: Path) -> None:
    """A mistyped --key-file must not create (and record) a second active key."""
    missing = tmp_path / "typo" / "affidavit-signing.key"
    shown = cli("keys", "show", "--key-file", str(missing), "--db", store_url, "--json")
    assert shown.returncode == 3
    assert "no signing key at" in json_of(shown)["error"]["message"]
    assert not missing.parent.exists()
    # `keys rotate --key-file` is how a key is made at a chosen path; then `show` reads it
    made = json_of(cli("keys", "rotate", "--key-file", str(missing), "--db", store_url, "--json"))
    again = cli("keys", "show", "--key-file", str(missing), "--db", store_url, "--json")
    assert again.returncode == 0 and json_of(again)["key_id"] == made["key_id"]


def test_text_from_the_database_is_printed_as_text(store_url: str, tmp_path: Path) -> None:
    """Ids, details and payloads are printed as they are, never read as Rich markup: a `[/]`
    in a tampered seal row, a job id or a job's input neither crashes the output nor is lost."""
    with Runtime(store_url, tools=tools()) as rt:
        job_id = rt.submit(TWO_CHARGES, {"a": "[/]", "amount": 1}).job_id
        rt.run_until_idle()
    events = cli("jobs", "events", job_id, "--db", store_url)
    assert (events.returncode, events.stderr) == (0, "")
    assert '"input":{"a":"[/]"' in events.stdout

    RawDb(store_url).execute("UPDATE seals SET key_id = ? WHERE job_id = ?", ("[/]k", job_id))
    human = cli("verify", job_id, "--db", store_url)
    assert human.returncode == 1 and "Traceback" not in human.stderr
    assert "the seal is signed by unknown key [/]k" in human.stdout
    assert "NOT verified: seal failed" in human.stdout
    every = cli("verify", "--all", "--db", store_url)
    assert every.returncode == 1 and "Traceback" not in every.stderr
    assert "unknown key [/]k" in every.stdout

    for unknown in ("no[/]such", "[bold]job"):
        missing = cli("verify", unknown, "--db", store_url)
        assert missing.returncode == 2, missing.stderr
        assert f"job '{unknown}' not found" in missing.stderr


def test_events_of_an_edited_log_are_an_error_or_shown_not_a_crash(
    store_url: str, tmp_path: Path
) -> None:
    """A payload edited into bytes that are not JSON: `jobs events --json` cannot print it as
    an object and says so (exit 3, the version named, no traceback); the table shows it.
    `jobs trace` cannot fold it and says so the same way, with and without --json."""
    job_id = finished_job(store_url, tmp_path)
    raw = RawDb(store_url)
    version = raw.events(job_id)[3][0]
    for edited in (b"{'not': 'json'}", b"\xff\xfe not UTF-8"):
        raw.set_payload(job_id, version, edited)
        exported = cli("jobs", "events", job_id, "--db", store_url, "--json")
        assert exported.returncode == 3, exported.stderr
        error = json_of(exported)["error"]
        assert error["code"] == "replay_error"
        assert error["message"] == f"job {job_id}, event {version}: the stored payload is not JSON"
        assert "affidavit verify" in error["hint"]
        table = cli("jobs", "events", job_id, "--db", store_url)
        assert (table.returncode, table.stderr) == (0, ""), table.stderr
        assert "not" in table.stdout
        assert cli("verify", job_id, "--db", store_url, "--json").returncode == 1
        traced = cli("jobs", "trace", job_id, "--db", store_url, "--json")
        assert traced.returncode == 3, traced.stderr
        assert "Traceback" not in traced.stderr
        assert json_of(traced)["error"] == error
        human = cli("jobs", "trace", job_id, "--db", store_url)
        assert human.returncode == 3 and "Traceback" not in human.stderr
        assert f"event {version}: the stored payload is not JSON" in human.stderr


def test_a_job_row_edited_into_output_that_is_not_json_is_shown(
    store_url: str, tmp_path: Path
) -> None:
    """Every command that reads the job shows it, with the edited field reported unreadable
    and a pointer to `affidavit verify`; never a traceback. A sound job is shown as before."""
    job_id = finished_job(store_url, tmp_path)
    sound = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert "unreadable" not in sound
    RawDb(store_url).execute("UPDATE jobs SET output = 'x' WHERE job_id = ?", (job_id,))

    shown = cli("jobs", "show", job_id, "--db", store_url, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json_of(shown)
    assert doc["output"] is None and "affidavit verify" in doc["unreadable"]["output"]
    assert {k: v for k, v in doc.items() if k not in ("output", "unreadable")} == {
        k: v for k, v in sound.items() if k != "output"
    }
    human = cli("jobs", "show", job_id, "--db", store_url)
    assert (human.returncode, human.stderr) == (0, "")
    assert "unreadable" in human.stdout and "not JSON" in human.stdout

    listed = cli("jobs", "list", "--db", store_url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json_of(listed)[0]["unreadable"] == doc["unreadable"]
    assert cli("jobs", "list", "--db", store_url).returncode == 0

    waited = cli("jobs", "wait", job_id, "--db", store_url, "--json")
    assert waited.returncode == 0, waited.stderr
    assert json_of(waited) == {
        "job_id": job_id,
        "status": "completed",
        "output": None,
        "error": None,
        "unreadable": doc["unreadable"],
    }
    waited_human = cli("jobs", "wait", job_id, "--db", store_url)
    assert waited_human.returncode == 0 and "Traceback" not in waited_human.stderr
    assert "output: unreadable" in waited_human.stderr
    assert f"affidavit verify {job_id}" in waited_human.stderr

    traced = cli("jobs", "trace", job_id, "--db", store_url, "--json")
    assert traced.returncode == 0, traced.stderr
    assert json_of(traced)["job"]["unreadable"] == doc["unreadable"]
    for command in (("jobs", "events", job_id), ("jobs", "trace", job_id)):
        assert cli(*command, "--db", store_url).returncode == 0
    assert cli("verify", job_id, "--db", store_url).returncode == 1


def _submit_pending(url: str, count: int) -> None:
    """``count`` pending jobs of one pure step (each verifies)."""
    plan = {"nodes": [{"id": "a", "type": "pure", "tool": "decide_refund", "args": {}}]}
    with Runtime(url, tools=refund.TOOLS) as rt:
        for _ in range(count):
            rt.submit(plan, {})


def _verify_all_on_terminal(url: str, as_json: Path | None = None) -> tuple[int, list[str]]:
    """``affidavit verify --all`` run in this process, without --json (or with it, stdout
    going to the file ``as_json``): its tracemalloc peak, and the statements that listed the
    jobs to verify."""
    listings: list[str] = []

    def spied(method: Any) -> Any:
        def call(self: SqlSnapshot, sql: str, *args: Any, **kwargs: Any) -> Any:
            if sql.startswith("SELECT j.job_id FROM jobs j"):
                listings.append(sql)
            return method(self, sql, *args, **kwargs)

        return call

    gc.collect()
    with pytest.MonkeyPatch.context() as mp:
        for snapshot in (SqliteSnapshot, PostgresSnapshot):
            mp.setattr(snapshot, "query", spied(snapshot.query))
            mp.setattr(snapshot, "stream", spied(snapshot.stream))
        with open(as_json or os.devnull, "w", encoding="utf-8") as stdout:
            if as_json is not None:
                mp.setattr(sys, "stdout", stdout)
            tracemalloc.start()
            try:
                verify_cmd(all_jobs=True, db=url, as_json=as_json is not None)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    return peak, listings


def test_verify_all_memory_holds_ids_not_results(store_url: str, tmp_path: Path) -> None:
    """`verify --all` keeps the failures and a count, not a result per job (about 700 bytes
    each); with --json, which prints every result, it spools them to a file as they come (the
    results and the document's text took ~6 KB a job). Its listing is one streamed query, not
    pages at an offset that re-read the pages before them."""
    out = tmp_path / "out.json"
    _submit_pending(store_url, 250)
    _verify_all_on_terminal(store_url)  # (what the first runs allocate once: imports, caches)
    _verify_all_on_terminal(store_url, as_json=out)
    small, _ = _verify_all_on_terminal(store_url)
    small_json, _ = _verify_all_on_terminal(store_url, as_json=out)
    _submit_pending(store_url, 800)  # 1,050 jobs: more than one page of 1,000
    large, listings = _verify_all_on_terminal(store_url)
    large_json, _ = _verify_all_on_terminal(store_url, as_json=out)
    per_job = (large - small) / 800
    assert per_job < 500, (small, large)  # a job id (and a row fetched), not a result
    assert len(listings) == 1, listings
    per_job_json = (large_json - small_json) / 800
    assert per_job_json < 500, (small_json, large_json)
    doc = json.loads(out.read_text())
    assert (doc["jobs"], doc["verified"], len(doc["results"])) == (1050, 1050, 1050)
    assert out.read_text() == as_emitted(doc)
