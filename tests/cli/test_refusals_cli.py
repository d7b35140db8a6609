"""Refused commands create and write nothing, and say why in one line (real subprocesses,
both backends): a plan or input file that is not UTF-8, an invalid plan or input, an unknown
job, a lease that never ends, a result given with the wrong decision. Also: human output
keeps ids whole when piped, and the demo runs on a database it is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from affidavit import Runtime
from affidavit.examples import refund
from tests.cli.test_cli import cli, cli_env, json_of, seeded
from tests.conftest import PG_URL

TOOLS = "affidavit.examples.refund"


def database_exists(url: str) -> bool:
    """Whether the SQLite file, or the PostgreSQL schema, of ``url`` exists."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).exists()
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    return found is not None


def assert_refused(result: object, fragment: str) -> None:
    assert isinstance(result, subprocess.CompletedProcess)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert fragment in json_of(result)["error"]["message"]


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(refund.PLAN))
    return path


@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize(
    "case",
    ["plan_not_utf8", "input_not_utf8", "bad_plan", "unknown_tool", "bad_input", "blank_key"],
)
def test_a_refused_submission_creates_no_database(
    empty_store_url: str, tmp_path: Path, plan_file: Path, command: str, case: str
) -> None:
    plan, input_arg, key = plan_file, '{"order_id": "A-1001"}', []
    if case == "plan_not_utf8":
        plan = tmp_path / "bad.yaml"
        plan.write_bytes(b"nodes: [\xff\xfe]\n")
    elif case == "input_not_utf8":
        (tmp_path / "input.bin").write_bytes(b'{"order_id": "\xff"}')
        input_arg = f"@{tmp_path / 'input.bin'}"
    elif case == "bad_plan":
        plan.write_text(json.dumps({"nodes": [{"id": "x", "type": "robot"}]}))
    elif case == "unknown_tool":
        plan.write_text(json.dumps({"nodes": [{"id": "x", "type": "tool", "tool": "nope"}]}))
    elif case == "blank_key":  # an unset variable: refused before the database is opened
        key = ["--idempotency-key", " "]
    else:
        input_arg = '{"amount": 1e400}'
    fragment = {
        "plan_not_utf8": "is not UTF-8 text",
        "input_not_utf8": "is not UTF-8 text",
        "bad_plan": "unknown type",
        "unknown_tool": "not registered",
        "bad_input": "not finite",
        "blank_key": "the idempotency key is blank",
    }[case]
    args = [
        command,
        str(plan),
        "--tools",
        TOOLS,
        "--input",
        input_arg,
        *key,
        "--db",
        empty_store_url,
    ]
    assert_refused(cli(*args, "--json"), fragment)
    assert not database_exists(empty_store_url)


@pytest.mark.parametrize("case", ["input_key_twice", "input_too_deep", "plan_too_deep"])
def test_ambiguous_or_too_deep_json_is_refused(
    empty_store_url: str, tmp_path: Path, plan_file: Path, case: str
) -> None:
    """An input giving a key twice (a parser keeps one of the two values silently), and JSON
    or YAML nested deeper than the parser can read: a one-line error, nothing written."""
    plan, input_arg = plan_file, '{"order_id": "A-1001"}'
    if case == "input_key_twice":
        input_arg = '{"order_id": "A-1001", "order_id": "A-1002"}'
    elif case == "input_too_deep":
        (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
        input_arg = f"@{tmp_path / 'deep.json'}"
    else:
        plan = tmp_path / "deep.yaml"
        plan.write_text("nodes: " + "[" * 100_000 + "]" * 100_000 + "\n")
    fragment = {
        "input_key_twice": "--input is not valid JSON: key 'order_id' appears twice",
        "input_too_deep": "--input is not valid JSON: arrays and objects are nested too deeply",
        "plan_too_deep": "is not valid YAML: sequences and mappings are nested too deeply",
    }[case]
    args = ["submit", str(plan), "--tools", TOOLS, "--input", input_arg, "--db", empty_store_url]
    assert_refused(cli(*args, "--json"), fragment)
    assert not database_exists(empty_store_url)


@pytest.mark.parametrize("command", ["cancel", "signal", "resume"])
def test_a_decision_on_an_unknown_job_creates_nothing(empty_store_url: str, command: str) -> None:
    extra = {"signal": ["--key", "k"], "resume": ["--decision", "fail"], "cancel": []}[command]
    result = cli(command, "no-such-job", *extra, "--db", empty_store_url, "--json")
    assert result.returncode in (2, 3), result.stderr  # unknown job, or no database at all
    assert "Traceback" not in result.stderr
    assert "error" in json_of(result)
    assert not database_exists(empty_store_url)
    assert not Path(os.environ["AFFIDAVIT_SIGNING_KEY"]).exists()


@pytest.mark.parametrize("command", ["cancel", "resume"])
def test_a_refused_decision_on_a_known_job_creates_no_key(
    store_url: str, tmp_path: Path, plan_file: Path, command: str
) -> None:
    """Cancelling a finished job, or failing one that is not parked, is refused before the
    signing key is loaded: on a machine whose key file is elsewhere (an auditor's copy of the
    database, say), the refusal creates no key file and records no key."""
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    submitted = cli("submit", str(plan_file), "--tools", TOOLS, "--input", job_input,
                    "--db", store_url, "--json")  # fmt: skip
    job_id = json_of(submitted)["job_id"]
    if command == "cancel":  # finished (and sealed with the usual key)
        assert cli("cancel", job_id, "--db", store_url, "--json").returncode == 0
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        keys = rt.store.signing_keys()
    elsewhere = tmp_path / "elsewhere" / "signing.key"
    extra = ["--decision", "fail"] if command == "resume" else []
    refused = cli(command, job_id, *extra, "--db", store_url, "--json",
                  env={"AFFIDAVIT_SIGNING_KEY": str(elsewhere)})  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert json_of(refused)["error"]["code"] == "invalid_state"
    assert not elsewhere.exists()
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        assert rt.store.signing_keys() == keys


def test_a_decision_on_a_known_job_still_works(
    store_url: str, tmp_path: Path, plan_file: Path
) -> None:
    """The read-only look-up before a decision does not get in its way."""
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    submitted = cli("submit", str(plan_file), "--tools", TOOLS, "--input", job_input,
                    "--db", store_url, "--json")  # fmt: skip
    job_id = json_of(submitted)["job_id"]
    cancelled = cli("cancel", job_id, "--db", store_url, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json_of(cancelled)["status"] == "cancelled"


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_lease_that_never_ends_is_refused(
    empty_store_url: str, plan_file: Path, tmp_path: Path, how: str
) -> None:
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    args = ["run", str(plan_file), "--tools", TOOLS, "--input", job_input, "--db", empty_store_url]
    if how == "flag":
        result = cli(*args, "--lease-seconds", "inf", "--json")
    else:
        result = cli(*args, "--json", env={**os.environ, "AFFIDAVIT_LEASE_SECONDS": "inf"})
    assert_refused(result, "finite")
    assert not database_exists(empty_store_url)


def test_a_lease_below_the_minimum_is_refused_from_the_environment(
    empty_store_url: str, plan_file: Path, tmp_path: Path
) -> None:
    """`$AFFIDAVIT_LEASE_SECONDS` holds the lease to the bound `--lease-seconds` has (≥ 0.1)."""
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    args = ["run", str(plan_file), "--tools", TOOLS, "--input", job_input, "--db", empty_store_url]
    result = cli(*args, "--json", env={**os.environ, "AFFIDAVIT_LEASE_SECONDS": "0.001"})
    assert_refused(result, "0.1")
    assert not database_exists(empty_store_url)


def test_a_result_goes_only_with_accept_result(store_url: str, tmp_path: Path) -> None:
    from affidavit import Runtime
    from tests.runtime.crash_tools import REGISTRY, charge_plan
    from tests.runtime.helpers import run_driver, wait_lease_expired

    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(charge_plan("crash_charge_nr"), {"side": str(side), "amount": 1}).job_id
        run_driver(store_url, "--job", job_id, "--lease", "0.5", crash="tool.after_execute")
        wait_lease_expired(rt.store, job_id)
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "parked"
        before = rt.get_job(job_id).version
    result = cli("resume", job_id, "--decision", "retry", "--result", '{"x": 1}',
                 "--db", store_url, "--json")  # fmt: skip
    assert_refused(result, "only with accept_result")
    with Runtime(store_url, tools=REGISTRY) as rt:
        assert rt.get_job(job_id).version == before  # nothing appended
        assert rt.get_job(job_id).status == "parked"


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with no terminal anywhere (stdin too: Rich asks it for a width) and no
    $COLUMNS: as in a script or a pipe."""
    env = cli_env()
    env.pop("COLUMNS", None)
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip


def test_piped_output_keeps_ids_whole(tmp_path: Path, plan_file: Path) -> None:
    """Without a terminal (and without $COLUMNS), tables are not squeezed to 80 columns and
    errors are not wrapped: a job id can be copied from `jobs list | cat`."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    job_id = json_of(cli("submit", str(plan_file), "--tools", TOOLS, "--input", job_input,
                         "--db", url, "--json"))["job_id"]  # fmt: skip
    listed = piped("jobs", "list", "--db", url)
    assert job_id in listed.stdout
    events = piped("jobs", "events", job_id, "--db", url)
    assert "plan_generated" in events.stdout
    error = piped("jobs", "list", "--db", "nonsense://x" + "y" * 80)
    assert error.returncode == 3
    lines = [line for line in error.stderr.splitlines() if line.strip()]
    assert len(lines[0]) > 80  # one line, not wrapped at 80 columns


def test_demo_runs_on_a_given_database(pg_schema: str, tmp_path: Path) -> None:
    url = f"{PG_URL}?schema={pg_schema}"
    result = cli("demo", "--db", url, "--lease-seconds", "0.5", "--json",
                 env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json_of(result)
    assert summary["ok"] and summary["database"] == url
    assert summary["tamper"]["detected"] and summary["tamper"]["verified"] is False
    # the refund as a plan, then as an agent: each once cleanly, once killed and recovered
    assert [j["crashed_and_recovered"] for j in summary["jobs"]] == [False, True, False, True]
    # the jobs stay in the given database, and verify there
    for job in summary["jobs"]:
        verified = cli("verify", job["job_id"], "--db", url, "--json")
        assert verified.returncode == 0, verified.stdout
    # the demo runs only its own jobs: another job waiting in the database stays untouched
    with Runtime(url, tools=refund.TOOLS) as rt:
        other = rt.submit(refund.PLAN, {"order_id": "A-1001", "data_dir": str(tmp_path)}).job_id
    # a second run on the same database is its own (its idempotency key is fresh)
    again = cli("demo", "--db", url, "--lease-seconds", "0.5", "--json",
                env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert {j["job_id"] for j in json_of(again)["jobs"]}.isdisjoint(
        {j["job_id"] for j in summary["jobs"]}
    )
    with Runtime(url, tools=refund.TOOLS) as rt:
        untouched = rt.get_job(other)
        assert (untouched.status, untouched.version, untouched.lease_owner) == ("pending", 2, None)


TOOLS_FILE = """\
import affidavit

@affidavit.tool("stamp")
def stamp(ctx: affidavit.ToolContext) -> dict:
    return {"stamped": True}
"""


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("import sys\nsys.exit(2)\n", "failed to import: SystemExit(2)"),
        ("def broken(:\n", "failed to import: SyntaxError"),
        ("raise RuntimeError('no config')\n", "failed to import: RuntimeError('no config')"),
    ],
    ids=["exits", "syntax", "raises"],
)
def test_a_tools_file_that_fails_to_import_is_refused(
    empty_store_url: str, tmp_path: Path, source: str, fragment: str
) -> None:
    tools = tmp_path / "my tools.py"
    tools.write_text(source)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "s", "type": "tool", "tool": "stamp"}]}))
    result = cli("run", str(plan), "--tools", str(tools), "--db", empty_store_url, "--json")
    assert_refused(result, fragment)
    assert json_of(result)["error"]["hint"]
    assert not database_exists(empty_store_url)


def test_the_same_tools_file_twice_is_loaded_once(store_url: str, tmp_path: Path) -> None:
    """As a dotted module name given twice is imported once."""
    tools = tmp_path / "stamp_tools.py"
    tools.write_text(TOOLS_FILE)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "s", "type": "tool", "tool": "stamp"}]}))
    relative = os.path.relpath(tools)
    args = ("--tools", str(tools), "--tools", relative, "--db", store_url, "--json")
    result = cli("run", str(plan), *args)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert json_of(result)["output"] == {"s": {"stamped": True}}


def test_a_tools_file_imports_the_modules_beside_it(store_url: str, tmp_path: Path) -> None:
    """As `python FILE` would: it failed with "No module named 'stamping'"."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "stamping.py").write_text("def stamp():\n    return {'stamped': True}\n")
    (project / "tools.py").write_text(
        "import affidavit\nfrom stamping import stamp\n\n"
        "@affidavit.tool('stamp')\ndef stamp_tool(ctx):\n    return stamp()\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "s", "type": "tool", "tool": "stamp"}]}))
    result = cli(
        "run", str(plan), "--tools", str(project / "tools.py"), "--db", store_url, "--json"
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert json_of(result)["output"] == {"s": {"stamped": True}}


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        (
            "tools.py",
            "The tools module imports 'not_installed_anywhere', which cannot be found: install "
            "it, or put it on PYTHONPATH (a .py file's own directory is searched too).",
        ),
        (
            "no_such_tools.module",
            "Pass a dotted module name on PYTHONPATH or a path to a .py file.",
        ),
    ],
    ids=["its-import-missing", "itself-missing"],
)
def test_a_missing_import_is_told_from_a_missing_tools_module(
    empty_store_url: str, tmp_path: Path, spec: str, hint: str
) -> None:
    (tmp_path / "tools.py").write_text("import not_installed_anywhere\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "s", "type": "tool", "tool": "stamp"}]}))
    given = str(tmp_path / spec) if spec.endswith(".py") else spec
    result = cli("run", str(plan), "--tools", given, "--db", empty_store_url, "--json")
    assert_refused(result, "cannot import tools module")
    assert json_of(result)["error"]["hint"] == hint
    assert not database_exists(empty_store_url)


@pytest.mark.parametrize("index", ["\u00b2", "\u0663"], ids=["superscript-two", "arabic-three"])
def test_a_list_index_that_is_not_ascii_digits_is_refused(
    empty_store_url: str, tmp_path: Path, index: str
) -> None:
    """`${input.xs.²}` names no element of a list: refused like any missing field, not with a
    traceback (Python counts '²' as a digit but cannot make it an int)."""
    plan = tmp_path / "plan.json"
    args = {"order_id": f"${{input.xs.{index}}}"}
    plan.write_text(
        json.dumps({"nodes": [{"id": "a", "type": "tool", "tool": "lookup_order", "args": args}]})
    )
    job_input = json.dumps({"xs": [1, 2, 3, 4]})
    result = cli(
        "submit",
        str(plan),
        "--tools",
        TOOLS,
        "--input",
        job_input,
        "--db",
        empty_store_url,
        "--json",
    )
    assert_refused(result, f"'input.xs' has no field {index!r}")
    assert not database_exists(empty_store_url)


NOT_UTF8 = "job-\udcff"  # the byte 0xff on the command line, as Python decodes argv


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "show", NOT_UTF8],
        ["jobs", "events", NOT_UTF8],
        ["jobs", "wait", NOT_UTF8],
        ["jobs", "trace", NOT_UTF8],
        ["verify", NOT_UTF8],
        ["cancel", NOT_UTF8],
        ["signal", NOT_UTF8, "--key", "k"],
        ["resume", NOT_UTF8, "--decision", "fail"],
        ["jobs", "list", "--namespace", NOT_UTF8],
        ["verify", "--all", "--namespace", NOT_UTF8],
    ],
    ids=lambda c: " ".join(c[:2]) + (" --namespace" if "--namespace" in c else ""),
)
def test_an_argument_that_is_not_utf8_is_refused(store_url: str, command: list[str]) -> None:
    """A job id or namespace with a byte that is not UTF-8 names no job: not found (or a
    refused filter), not a traceback from the database driver."""
    seeded(store_url)
    result = cli(*command, "--db", store_url, "--json")
    assert "Traceback" not in result.stderr
    assert result.returncode == (3 if "--namespace" in command else 2), result.stderr
    assert "error" in json_of(result)


def test_run_with_an_unusable_signing_key_submits_nothing(
    empty_store_url: str, tmp_path: Path, plan_file: Path
) -> None:
    """The key that would seal the job is checked before the job is submitted: a run that
    cannot seal does not leave a pending job behind its error."""
    key = tmp_path / "open.key"
    key.write_text("not a key")
    key.chmod(0o644)  # readable by others: refused
    shop = refund.setup_shop(tmp_path / "shop")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(shop)})
    result = cli("run", str(plan_file), "--tools", TOOLS, "--input", job_input,
                 "--db", empty_store_url, "--json",
                 env={"AFFIDAVIT_SIGNING_KEY": str(key)})  # fmt: skip
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "signing key" in json_of(result)["error"]["message"]
    if database_exists(empty_store_url):
        with Runtime(empty_store_url, signing_key=tmp_path / "other.key") as rt:
            assert rt.store.list_jobs() == []


@pytest.mark.parametrize(
    "command", [["submit", "PLAN"], ["jobs", "list"], ["db", "migrate"], ["demo"]]
)
def test_an_empty_db_url_is_refused(tmp_path: Path, plan_file: Path, command: list[str]) -> None:
    """`--db ""` (an unset variable in a script) is not the default database: it names none."""
    args = [str(plan_file) if a == "PLAN" else a for a in command]
    if command[0] == "submit":
        job_input = {"order_id": "A-1001", "data_dir": str(tmp_path)}
        args += ["--tools", TOOLS, "--input", json.dumps(job_input)]
    result = cli(*args, "--db", "", "--json", cwd=tmp_path)
    assert_refused(result, "database URL")
    assert not (tmp_path / "affidavit.db").exists()
