"""What the everyday commands import, as a user runs them (human output, SQLite): each loads
the modules its work needs, not the server's, the worker's, the other commands' or PostgreSQL's
— the start of a command is mostly its imports (benchmarks/bench_startup.py measures it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from affidavit.examples import refund
from tests.cli.test_cli import cli_env

# Run as the console script runs, then report which of these were imported (on stderr, after
# the command's own output).
_REPORT = (
    "import sys\n"
    "from affidavit.cli.launch import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit as exit:\n"
    "    code = exit.code\n"
    "print('exit', code, sorted(sys.modules), file=sys.stderr)\n"
)

# Not imported by any of the four: the PostgreSQL driver, the API's models and clients, schemas,
# the worker machinery, the other commands' modules.
NEVER = (
    "psycopg",
    "psycopg_pool",
    "pydantic",
    "jsonschema",
    "httpx",
    "fastapi",
    "rich.progress",
    "affidavit.api",
    "affidavit.claims",
    "affidavit.packs",
    "affidavit.tlog",
    "affidavit.runtime._worker",
    "affidavit.runtime._runner",
    "affidavit.runtime._step_executor",
    "affidavit.runtime._children",
    "affidavit.cli.run_cmds",
    "affidavit.cli.serve_cmds",
    "affidavit.cli.claims_cmds",
    "affidavit.cli.pack_cmds",
    "affidavit.cli.log_cmds",
)
# Only `verify` checks a seal's signature: the others read without the verifier's proofs or
# the signing library.
VERIFY_ONLY = ("cryptography", "affidavit.verify", "affidavit.verify._fold")


def _modules(*args: str, cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _REPORT, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=cwd,
        timeout=120,
    )
    last = done.stderr.strip().splitlines()[-1]
    word, code, listed = last.split(" ", 2)
    assert (word, code) == ("exit", "0"), done.stderr
    return set(json.loads(listed.replace("'", '"')))


def _imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` among ``modules`` (a package counts with any of its modules)."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_the_everyday_commands_import_only_what_they_use(tmp_path: Path) -> None:
    refund.setup_shop(tmp_path / "shop")
    plan = tmp_path / "refund.json"
    plan.write_text(json.dumps(refund.PLAN))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(tmp_path / "shop")})
    submit = ("submit", str(plan), "--tools", "affidavit.examples.refund", "--input", job_input)
    submitted = _modules(*submit, "--db", url, cwd=tmp_path)
    assert "affidavit.runtime._submit" in submitted  # (what it is for)
    others = ("affidavit.cli.jobs", "affidavit.cli.verify_cmds")
    assert _imported(submitted, (*NEVER, *VERIFY_ONLY, *others, "rich")) == []  # printed plain

    job_id = subprocess.run(
        [sys.executable, "-m", "affidavit", *submit, "--db", url],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=True,
    ).stdout.strip()
    for args in (("jobs", "list"), ("jobs", "show", job_id)):
        modules = _modules(*args, "--db", url, cwd=tmp_path)
        assert "rich.table" in modules, args  # (the table it prints)
        others = ("affidavit.cli.submit_cmds", "affidavit.cli.verify_cmds", "affidavit.runtime")
        assert _imported(modules, (*NEVER, *VERIFY_ONLY, *others)) == [], args
        assert "affidavit.cli.jobs" in modules

    verified = _modules("verify", job_id, "--db", url, cwd=tmp_path)
    assert {"affidavit.verify._fold", "rich.table"} <= verified
    others = ("affidavit.cli.submit_cmds", "affidavit.cli.jobs", "affidavit.runtime")
    assert _imported(verified, (*NEVER, *others)) == []
