"""The CLI as a user runs it: a real subprocess per command, on both backends."""

from __future__ import annotations

import importlib
import io
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from affidavit import __version__
from affidavit.core.canonical import canonical
from affidavit.store import NewEvent, migrations, open_store
from tests.store.legacy import undo_migration_6

SRC = str(Path(__file__).parents[2] / "src")


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a CLI subprocess runs in: this checkout's sources, a wide terminal, and
    (unless ``env`` is given) no database URL from the caller's environment."""
    full_env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200", **(env or {})}
    full_env.pop("AFFIDAVIT_DATABASE_URL", None) if env is None else None
    return full_env


# Commands that ``cli`` runs in this process, through the console script's own entry point,
# with the call's environment, working directory, standard streams and import path: they read
# or write the store and print, start no server, worker or sandbox, run no tool, and reach no
# crash point (``submit`` imports the tools module to check the plan against it: the modules
# it imports and the tools it registers are forgotten after the call, see ``_own_imports``).
# Starting a process costs ~0.3 s, most of it imports, and the suite runs some thousand of
# these. ``run`` and ``worker --until-idle`` run their jobs' tools here too (the tools module
# is imported as in a new process and forgotten after the call; a thread the command leaves
# running fails the call, as a process of its own would have ended it); a worker that polls
# until stopped, supervises processes (--processes) or serves metrics runs in its own process.
# Everything else (serve, mcp, witness, demo, db clock, ...), `--help`, and any call with a
# crash point, a preloaded library (libfaketime) or OpenTelemetry set runs as a real process:
# ``cli_process``, which a test about the process itself (exit on a signal, a crash, a step
# that kills or exits its process) calls.
IN_PROCESS: frozenset[tuple[str, ...]] = frozenset(
    {
        ("jobs", "show"),
        ("jobs", "list"),
        ("jobs", "events"),
        ("jobs", "trace"),
        ("verify",),
        ("keys", "show"),
        ("log", "verify"),
        ("log", "proof"),
        ("log", "checkpoint"),
        ("log", "consistency"),
        ("log", "key"),
        ("disclose",),
        ("pack", "export"),
        ("pack", "verify"),
        ("trust", "show"),
        ("trust", "history"),
        ("claims", "history"),
        ("claims", "stats"),
        ("db", "migrate"),
        ("submit",),
        ("signal",),
        ("resume",),
        ("cancel",),
        ("jobs", "wait"),
        ("keys", "list"),
        ("keys", "trust"),
        ("apikeys",),
        ("log", "integrate"),
        ("log", "rejected"),
        ("claims", "show"),
        ("agents",),
        ("retention",),
        # (the claim's command runs in a sandbox process of its own either way)
        ("claims", "verify"),
        ("rce-verify",),
        ("keys", "rotate"),
        ("queues",),
        ("limits",),
        ("schedules",),
        ("jobs", "fork"),
        ("run",),
        ("worker",),
    }
)

# Options that make ``worker`` a process of its own: without --until-idle it polls until
# stopped; --processes starts worker processes; --metrics-port serves HTTP.
_WORKER_IN_PROCESS = "--until-idle"
_WORKER_OWN_PROCESS = ("--processes", "--metrics-port")

# Variables that change the process itself (a library preloaded into it, the clock it sees).
_PROCESS_VARIABLES = ("LD_PRELOAD", "FAKETIME", "DYLD_INSERT_LIBRARIES")


def _in_process(args: tuple[str, ...], env: dict[str, str]) -> bool:
    if "--help" in args or any(name.startswith("AFFIDAVIT_CRASH") for name in env):
        return False
    if any(env.get(name) != os.environ.get(name) for name in _PROCESS_VARIABLES):
        return False
    if any(name.startswith("OTEL_") for name in env):  # (a global tracer, an atexit flush)
        return False
    if args[:1] == ("worker",) and (
        _WORKER_IN_PROCESS not in args or any(a in _WORKER_OWN_PROCESS for a in args)
    ):
        return False
    return args[:1] in IN_PROCESS or args[:2] in IN_PROCESS


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``affidavit ARGS`` as a user runs it; its exit code, stdout and stderr."""
    full_env = cli_env(env)
    if _in_process(args, full_env):
        return _run_in_process(args, full_env, cwd)
    return cli_process(*args, env=env, cwd=cwd)


def cli_process(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``affidavit ARGS`` in a real process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True,
        text=True,
        env=cli_env(env),
        cwd=cwd,
        timeout=120,
    )


def _run_in_process(
    args: tuple[str, ...], env: dict[str, str], cwd: Path | None
) -> subprocess.CompletedProcess[str]:
    """Run the command as ``affidavit.cli.main.main`` would in its own process: ``env`` as the
    whole environment, ``cwd`` as the working directory, an empty stdin, stdout and stderr
    captured as bytes decoded as UTF-8; an exception that escapes is printed as the
    interpreter would print it, with exit code 1."""
    from affidavit.cli import output
    from affidavit.cli.main import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="") for _ in range(2)]
    # (the Rich consoles are made on first use and read the environment then: made anew here)
    consoles = {name: output.__dict__.pop(name, None) for name in ("out", "err")}
    code: int | str | None = 0
    threads = set(threading.enumerate())
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO("")
        sys.stdout, sys.stderr = streams
        try:
            with _own_imports(env), _own_worker_id(), _own_logging():
                main(list(args))
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # (what the interpreter does with an uncaught exception)
            traceback.print_exc()
            code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for name, console in consoles.items():
            output.__dict__.pop(name, None)
            if console is not None:
                output.__dict__[name] = console
    _no_thread_left(threads, args)
    stdout, stderr = (_read(stream) for stream in streams)
    if isinstance(code, str):  # (SystemExit("message"): printed on stderr, exit 1)
        stderr, code = stderr + code + "\n", 1
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "affidavit", *args], code or 0, stdout, stderr
    )


# Daemon threads a command may leave behind, each harmless once the command has returned: a
# lease's heartbeat helper, idle once its run stopped it (it renews no lease), waits for another
# run and ends after its idle time (~10 s).
_IDLE_DAEMONS = frozenset({"heartbeat"})


def _no_thread_left(before: set[threading.Thread], args: tuple[str, ...]) -> None:
    """The threads the command started have ended, as at the exit of a process of its own:
    a thread that is not a daemon is waited for (a process waits for it too), a daemon (which
    a process would end) must have ended unless it is one of ``_IDLE_DAEMONS``; a thread
    still running fails the call."""
    left = [t for t in threading.enumerate() if t not in before]
    for thread in left:
        thread.join(10 if not thread.daemon else 0.5 if thread.name not in _IDLE_DAEMONS else 0)
    running = [t.name for t in left if t.is_alive() and t.name not in _IDLE_DAEMONS]
    assert not running, f"affidavit {' '.join(args)} left threads running: {running}"


@contextmanager
def _own_logging() -> Iterator[None]:
    """Logging as in a new process: no handler configured, so a warning goes to stderr through
    ``logging.lastResort`` (pytest's capturing handlers are set aside meanwhile)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


_calls = itertools.count(1)


@contextmanager
def _own_worker_id() -> Iterator[None]:
    """A worker's id names its process (host, pid, thread): a call here is given one of its
    own, as a process of its own would have, not the test process's."""
    from affidavit.runtime import _worker

    saved = _worker.default_worker_id
    own = f"{saved().rsplit(':', 1)[0]}-{next(_calls)}"
    _worker.default_worker_id = lambda: f"{own}:{threading.get_ident() % 100000}"
    try:
        yield
    finally:
        _worker.default_worker_id = saved


@contextmanager
def _own_imports(env: dict[str, str]) -> Iterator[None]:
    """Imports as in a new process of its own: ``python -m`` puts the working directory first
    on ``sys.path``, then ``PYTHONPATH``; the modules from outside the installed packages and
    this checkout's sources (tests, tools modules) are not imported yet, and the tool registry
    holds only what the other modules registered. Afterwards the path, those modules and the
    registry are as they were, and the modules the call imported from outside are forgotten (a
    tools file of the same name in another test's directory is then imported anew, as a new
    process would)."""
    from affidavit.runtime import registry

    saved_path = list(sys.path)
    hidden = {name: m for name, m in sys.modules.items() if not _installed(m)}
    saved_registry = dict(vars(registry))
    for name in hidden:
        del sys.modules[name]
    for name, value in saved_registry.items():
        setattr(registry, name, _registered_by_installed(value, hidden))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [os.getcwd(), *extra]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in [n for n, m in sys.modules.items() if not _installed(m)]:
            del sys.modules[name]
        sys.modules.update(hidden)
        for name, value in saved_registry.items():
            setattr(registry, name, value)


def _registered_by_installed(entries: dict[str, Any], hidden: dict[str, Any]) -> dict[str, Any]:
    """``entries`` (name → tool, agent, or a list of verifiers) without those defined in a
    module of ``hidden``."""

    def kept(entry: Any) -> bool:
        return getattr(getattr(entry, "fn", entry), "__module__", None) not in hidden

    return {
        name: [x for x in entry if kept(x)] if isinstance(entry, list) else entry
        for name, entry in entries.items()
        if isinstance(entry, list) or kept(entry)
    }


_INSTALLED = tuple(
    str(Path(p).resolve()) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, SRC}
)


def _installed(module: ModuleType) -> bool:
    """Whether ``module`` comes with the interpreter, an installed package or affidavit; the
    examples register tools when imported, which a new process has not done: they are
    imported anew, as the tests' modules are."""
    if str(getattr(module, "__name__", "")).split(".")[:2] == ["affidavit", "examples"]:
        return False
    file = getattr(module, "__file__", None)
    return file is None or str(Path(file).resolve()).startswith(_INSTALLED)


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    data: bytes = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return data.decode("utf-8", errors="replace")


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def seeded(url: str) -> str:
    store = open_store(url)
    try:
        job, _ = store.create_job(
            plan_name="refund",
            events=[NewEvent("job_created", {"input": {"order": 7}, "z": 1, "a": "é"})],
        )
        store.append(
            job.job_id, [NewEvent("node_started", {"node_id": "lookup"})], expected_version=1
        )
        return job.job_id
    finally:
        store.close()


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"affidavit {__version__}"


def test_db_migrate(empty_store_url: str) -> None:
    first = cli("db", "migrate", "--db", empty_store_url, "--json")
    assert first.returncode == 0, first.stderr
    sqlite = empty_store_url.startswith("sqlite")
    known = [m.version for m in migrations.load("sqlite" if sqlite else "postgres")]
    assert json_of(first) == {
        "backend": "sqlite" if sqlite else "postgresql",
        "applied": known,
        "schema_version": known[-1],
    }
    again = cli("db", "migrate", "--db", empty_store_url, "--json")
    assert json_of(again)["applied"] == []
    human = cli("db", "migrate", "--db", empty_store_url)
    assert "up to date" in human.stdout


def test_db_migrate_names_each_migration_it_applies(store_url: str) -> None:
    """Migration 6 rebuilds SQLite's events table: the command says what it is doing."""
    job_id = seeded(store_url)
    undo_migration_6(store_url)
    human = cli("db", "migrate", "--db", store_url)
    assert human.returncode == 0, human.stderr
    assert "applying migration 6 (event_keys)" in human.stderr
    assert "applying migration 7 (recoveries)" in human.stderr
    assert "applying migration 8 (job_listing)" in human.stderr
    assert "applying migration 10 (tlog)" in human.stderr
    assert "applying migration 11 (claims_made)" in human.stderr
    assert "applying migration 12 (seal_events_root)" in human.stderr
    folder = "sqlite" if store_url.startswith("sqlite") else "postgres"
    redone = [m for m in migrations.load(folder) if m.version >= 6]
    for m in redone:  # (migration 9 is PostgreSQL's only)
        assert f"applying migration {m.version} ({m.name})" in human.stderr
    versions = [m.version for m in redone]
    assert f"applied migrations {versions}; schema is at version {versions[-1]}" in human.stdout
    shown = cli("jobs", "show", job_id, "--db", store_url, "--json")
    assert json_of(shown)["event_count"] == 2


def test_jobs_list_show_events(store_url: str) -> None:
    job_id = seeded(store_url)
    listed = cli("jobs", "list", "--db", store_url, "--json")
    assert listed.returncode == 0, listed.stderr
    (job,) = json_of(listed)
    assert (job["job_id"], job["status"], job["event_count"]) == (job_id, "pending", 2)

    shown = cli("jobs", "show", job_id, "--db", store_url, "--json")
    assert json_of(shown)["plan_name"] == "refund"

    events = json_of(cli("jobs", "events", job_id, "--db", store_url, "--json"))
    assert [e["version"] for e in events] == [1, 2]
    assert set(events[0]) == {"version", "event_id", "type", "payload", "chain_hash"}
    assert events[0]["payload"] == {"input": {"order": 7}, "z": 1, "a": "é"}
    store = open_store(store_url)
    try:
        stored = store.list_events(job_id)
    finally:
        store.close()
    assert canonical(events[0]["payload"]) == stored[0].payload_bytes
    assert [e["chain_hash"] for e in events] == [e.chain_hash for e in stored]

    after = json_of(
        cli("jobs", "events", job_id, "--after-version", "1", "--db", store_url, "--json")
    )
    assert [e["version"] for e in after] == [2]

    human = cli("jobs", "events", job_id, "--db", store_url)
    assert "node_started" in human.stdout and human.returncode == 0
    human_list = cli("jobs", "list", "--db", store_url)
    assert job_id in human_list.stdout


def test_filters(store_url: str) -> None:
    seeded(store_url)
    assert json_of(cli("jobs", "list", "--status", "completed", "--db", store_url, "--json")) == []
    bad = cli("jobs", "list", "--status", "sleeping", "--db", store_url, "--json")
    assert bad.returncode == 3
    assert json_of(bad)["error"]["code"] == "config_error"


def test_jobs_list_pages_with_before(store_url: str) -> None:
    ids = [seeded(store_url) for _ in range(5)]
    newest_first = ids[::-1]
    pages: list[str] = []
    before: list[str] = []
    while True:
        result = cli("jobs", "list", "--limit", "2", *before, "--db", store_url, "--json")
        assert result.returncode == 0, result.stderr
        page = [j["job_id"] for j in json_of(result)]
        if not page:
            break
        pages += page
        before = ["--before", page[-1]]
    assert pages == newest_first
    human = cli("jobs", "list", "--before", newest_first[0], "--limit", "1", "--db", store_url)
    assert newest_first[1] in human.stdout and newest_first[0] not in human.stdout
    assert f"next page: --before {newest_first[1]}" in human.stderr  # a full page
    last = cli("jobs", "list", "--before", newest_first[3], "--limit", "2", "--db", store_url)
    assert newest_first[4] in last.stdout and "next page" not in last.stderr
    missing = cli("jobs", "list", "--before", "no-such-job", "--db", store_url, "--json")
    assert missing.returncode == 2
    assert json_of(missing)["error"]["code"] == "job_not_found"


def test_database_url_from_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    job_id = seeded(url)
    result = cli("jobs", "show", job_id, "--json", env={"AFFIDAVIT_DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    assert json_of(result)["job_id"] == job_id


def test_default_database_is_affidavit_db_in_cwd(tmp_path: Path) -> None:
    result = cli("db", "migrate", "--json", cwd=tmp_path, env={"AFFIDAVIT_DATABASE_URL": ""})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "affidavit.db").exists()


@pytest.mark.parametrize(
    ("args", "code", "error_code"),
    [
        (["jobs", "show", "nope"], 2, "job_not_found"),
        (["jobs", "events", "nope"], 2, "job_not_found"),
        (["jobs", "list", "--no-such-flag"], 3, "config_error"),
        (["jobs", "list", "--limit", "0"], 3, "config_error"),
    ],
)
def test_errors(store_url: str, args: list[str], code: int, error_code: str) -> None:
    assert cli("db", "migrate", "--db", store_url).returncode == 0  # an empty affidavit database
    as_json = cli(*args, "--db", store_url, "--json")
    assert as_json.returncode == code
    error = json_of(as_json)["error"]
    assert error["code"] == error_code
    assert error["message"] and error["hint"]
    human = cli(*args, "--db", store_url)
    assert human.returncode == code
    assert "Traceback" not in human.stderr


def test_unsupported_url_names_the_schemes(tmp_path: Path) -> None:
    result = cli("jobs", "list", "--db", "mysql://x@y/z", "--json")
    assert result.returncode == 3
    error = json_of(result)["error"]
    assert error["code"] == "unsupported_database_url"
    assert "sqlite:///" in error["message"] and "postgresql://" in error["message"]


def test_traceback_only_with_verbose() -> None:
    quiet = cli("jobs", "show", "x", "--db", "mysql://x")
    assert "Traceback" not in quiet.stderr and "error:" in quiet.stderr and "hint:" in quiet.stderr
    loud = cli("-v", "jobs", "show", "x", "--db", "mysql://x")
    assert "Traceback" in loud.stderr
    assert loud.returncode == 3


def test_demo(tmp_path: Path) -> None:
    result = cli("demo", "--json", env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    summary = json_of(result)
    assert summary["ok"]
    assert summary["crash"]["child_returncode"] == -9
    assert summary["tamper"]["detected"]
    assert summary["tamper"]["first_bad_version"] == summary["tamper"]["edited_version"]
    assert summary["tamper"]["verified"] is False
    assert summary["directory"].startswith(str(tmp_path))
    jobs = summary["jobs"]
    assert [j["crashed_and_recovered"] for j in jobs] == [False, True, False, True]
    assert [j["kind"] for j in jobs] == ["plan", "plan", "agent", "agent"]
    assert summary["crash"]["agent_child_returncode"] == -9
    for job in jobs:  # the real world: exactly one refund and one e-mail per order
        assert (job["status"], job["refunds_paid"], job["emails_sent"]) == ("completed", 1, 1)
        assert job["chain_ok"] and job["verified"] and job["seal_key_id"]
    events = json_of(
        cli("jobs", "events", jobs[1]["job_id"], "--db", summary["database"], "--json")
    )
    finished = [e["payload"] for e in events if e["type"] == "tool_invocation_finished"]
    assert any(p["node_id"] == "refund" and p["catch_up"] for p in finished)
    # the agent killed after the payment: recovered by reconcile (a catch-up), the refund once
    agent_events = json_of(
        cli("jobs", "events", jobs[3]["job_id"], "--db", summary["database"], "--json")
    )
    called = {
        e["payload"]["node_id"]: e["payload"]["tool_name"]
        for e in agent_events
        if e["type"] == "step_called"
    }
    caught_up = [
        called[e["payload"]["node_id"]]
        for e in agent_events
        if e["type"] == "tool_invocation_finished" and e["payload"]["catch_up"]
    ]
    assert caught_up == ["issue_refund"]
    assert list(called.values()).count("issue_refund") == 1
    human = cli("demo", env={"TMPDIR": str(tmp_path)})
    assert human.returncode == 0
    assert "demo ok" in human.stdout
    [verdict] = [line for line in human.stdout.splitlines() if "on the tampered copy" in line]
    assert "fails" in verdict and "stored_chain" in verdict and "seal" in verdict


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every command of the CLI: (its words, its docstring)."""
    found = []
    for info in group.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        found.append(((*path, name), info.callback.__doc__ or ""))
    for sub in group.registered_groups:
        found += _commands(sub.typer_instance, (*path, sub.name))
    return found


def test_help_wraps_at_the_terminal_not_at_the_docstring_line_breaks() -> None:
    import inspect

    from typer.testing import CliRunner

    from affidavit.cli.main import load_commands

    app = load_commands()
    commands = _commands(app)
    assert len(commands) > 20
    runner = CliRunner()
    for words, doc in commands:
        result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "2000"})
        assert result.exit_code == 0, (words, result.output)
        for paragraph in inspect.cleandoc(doc).split("\n\n"):
            line = " ".join(paragraph.split())
            # each paragraph is one line of the help, however the docstring broke it
            assert any(out.strip() == line for out in result.output.splitlines()), (words, line)


def test_help_states_the_defaults_and_choices_the_docs_state() -> None:
    """Help text that a user reads instead of docs/cli.md says what the command does: the
    demo's lease default (1 s, not the workers' 15), every node state `jobs trace` shows, every
    park `resume` resolves, where the signing key lives on PostgreSQL."""
    from typer.testing import CliRunner

    from affidavit.cli.main import load_commands
    from affidavit.record import NODE_STATES

    app = load_commands()

    def help_of(*words: str) -> str:
        result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "2000"})
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    demo = help_of("demo")
    assert "(default $AFFIDAVIT_LEASE_SECONDS, else 1)" in demo
    assert "else 15" not in demo
    trace = help_of("jobs", "trace")
    states = trace.split("state (", 1)[1].split(")", 1)[0]
    assert states.split(", ") == list(NODE_STATES)
    assert "crash_loop" in help_of("resume")
    for words in (("keys", "show"), ("keys", "rotate")):
        assert "$XDG_DATA_HOME/affidavit/" in help_of(*words)
