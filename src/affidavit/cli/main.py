"""The ``affidavit`` command. Every command takes ``--db`` and ``--json``; with ``--json`` it
prints one JSON document on stdout, and errors as ``{"error": {"code", "message", "hint"}}``.

Exit codes: 0 success; 1 a check failed; 2 not found; 3 usage or store error;
5 a claim refused (nothing ran).
"""

from __future__ import annotations

import copy
import errno
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.models import CommandInfo

from affidavit import __version__
from affidavit.cli import output, run_options
from affidavit.cli.common import DbOption, JsonOption, command, state
from affidavit.core.config import DEFAULT_LEASE_SECONDS, database_url
from affidavit.core.errors import ClockSkewError, ConfigError
from affidavit.store import open_store, url_backend
from affidavit.store.migrations import Migration

app = typer.Typer(
    name="affidavit",
    help="Run AI-agent jobs with at-most-once side effects and a verifiable record.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
db_app = typer.Typer(help="Database administration.", no_args_is_help=True)
app.add_typer(db_app, name="db")

# Where each top-level command is defined, beyond this module's own (``db``, ``demo``): a
# command line that names one of them loads that module's commands alone, so `affidavit worker`
# does not import the server, the packs, the transparency log's witness or the claims. Help for
# the whole program (and anything not named here) loads them all. A module ending in ``_app``
# is a group added under its name; ``module:function`` is the command of that name; a module
# alone has a ``register(app)``.
COMMAND_MODULES: dict[str, str] = {
    "run": "run_cmds:run",
    "submit": "submit_cmds:submit",
    "worker": "run_cmds:worker",
    "signal": "decision_cmds:signal",
    "resume": "decision_cmds:resume",
    "cancel": "cancel_cmds:cancel",
    "verify": "verify_cmds",
    "keys": "keys_cmds:keys_app",
    "pack": "pack_cmds",
    "rce-verify": "pack_cmds",
    "serve": "serve_cmds",
    "apikeys": "serve_cmds",
    "mcp": "mcp_cmds",
    "log": "log_cmds",
    "witness": "witness_cmds",
    "disclose": "disclose_cmds",
    "jobs": "jobs:jobs_app",
    "limits": "limits_cmds:limits_app",
    "schedules": "schedule_cmds:schedules_app",
    "agents": "claims_cmds:agents_app",
    "claims": "claims_cmds:claims_app",
    "trust": "claims_cmds:trust_app",
    "queues": "queue_cmds:queues_app",
    "retention": "retention_cmds:retention_app",
    "subjects": "subjects_cmds:subjects_app",
    "erase": "subjects_cmds:erase_app",
}
_registered: set[str] = set()
_OWN_COMMANDS = ("db", "demo")  # defined in this module


def _register(name: str, source: str) -> None:
    """Add command ``name`` from ``source`` (its value in :data:`COMMAND_MODULES`) to
    :data:`app`."""
    if source in _registered:
        return
    _registered.add(source)
    module_name, _, attribute = source.partition(":")
    module: Any = importlib.import_module(f"affidavit.cli.{module_name}")
    if attribute.endswith("_app"):
        app.add_typer(getattr(module, attribute), name=attribute.removesuffix("_app"))
    elif attribute:
        app.command(name)(getattr(module, attribute))
    else:
        module.register(app)


def load_commands(args: Sequence[str] = ()) -> typer.Typer:
    """The application for the command line ``args``: when its first word names a command,
    that command's module alone is imported and the application holds that command alone
    (and, for a group whose next word names one of its commands, that command alone), so that
    Typer builds only the command that runs; else :data:`app` with every command (help for the
    whole program, an unknown command: each is listed)."""
    at = _command_index(args)
    named = args[at] if at is not None else None
    if named in COMMAND_MODULES:
        _register(named, COMMAND_MODULES[named])
    elif named not in _OWN_COMMANDS:
        for name, source in COMMAND_MODULES.items():
            _register(name, source)
    _reflow_help(app)
    if at is None:
        return app
    sub = args[at + 1] if at + 1 < len(args) else None
    return _only(app, args[at], sub) or app


def _only(group: typer.Typer, name: str, sub: str | None = None) -> typer.Typer | None:
    """A copy of ``group`` that holds its command or sub-group ``name`` alone (a sub-group
    holding its command ``sub`` alone, when it has one of that name); ``None`` when ``group``
    has no ``name``. The copies share the commands; ``group`` itself is left as it is."""
    commands = [c for c in group.registered_commands if _name_of(c) == name]
    groups = [g for g in group.registered_groups if g.name == name]
    if not commands and not groups:
        return None
    view = copy.copy(group)
    view.registered_commands = commands
    view.registered_groups = groups
    if sub is not None and len(groups) == 1 and groups[0].typer_instance is not None:
        inner = _only(groups[0].typer_instance, sub)
        if inner is not None and inner.registered_commands:
            info = copy.copy(groups[0])
            info.typer_instance = inner
            view.registered_groups = [info]
    return view


def _name_of(info: CommandInfo) -> str | None:
    """A command's name as Typer gives it (its function's name, dashed, unless named)."""
    if info.name:
        return info.name
    return info.callback.__name__.lower().replace("_", "-") if info.callback else None


_ROOT_OPTIONS_WITH_VALUE = ("--max-input-bytes",)


def _command_index(args: Sequence[str]) -> int | None:
    """Where the first word of a command line that is not one of the program's own options
    is (``None``: there is none)."""
    skip = False
    for i, word in enumerate(args):
        if skip:
            skip = False
        elif word in _ROOT_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            return i
    return None


def _version(value: bool) -> None:
    if value:
        output.out.print(f"affidavit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Show tracebacks for errors.")
    ] = False,
    max_input_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-input-bytes",
            min=1,
            help="The most bytes read from one file given on the command line (a plan, "
            "@file arguments). Default: $AFFIDAVIT_MAX_INPUT_BYTES, else 64 MiB.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """affidavit: durable, verifiable execution for AI-agent jobs."""
    state.verbose = verbose
    state.max_input_bytes = max_input_bytes


@db_app.command("migrate")
def db_migrate(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Apply pending schema migrations (they are also applied whenever a store opens).

    Exit codes: 0 done; 3 the database cannot be reached or is newer than this version.
    """

    def progress(m: Migration) -> None:
        if not as_json:  # (a table rebuild takes as long as a copy of the table)
            output.err.print(f"applying migration {m.version} ({m.name}) …")

    with command(as_json):
        store = open_store(database_url(db), migrate=False)
        try:
            applied = store.migrate(progress)
            version = store.schema_version()
        finally:
            store.close()
    doc = {"backend": store.backend, "applied": applied, "schema_version": version}
    if as_json:
        output.emit_json(doc)
    elif applied:
        output.out.print(f"applied migrations {applied}; schema is at version {version}")
    else:
        output.out.print(f"schema is up to date (version {version})")


@db_app.command("clock")
def db_clock(
    db: DbOption = None,
    lease: Annotated[
        float | None,
        run_options.lease_option(
            "The workers' lease, which bounds the offset allowed",
            DEFAULT_LEASE_SECONDS,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check this host's clock against the database server's, as a worker does before its
    first claim: workers judge each other's leases by their own clocks, so each may be at most
    a sixth of the lease off the server's. Run it on a host before starting workers there.
    SQLite: the database is on this host, one clock — nothing to check.

    Exit codes: 0 the clock is close enough (or nothing to check); 1 it is too far off;
    3 usage or store error.
    """
    from affidavit.runtime import allowed_clock_offset, clock_problem

    with command(as_json):
        lease_seconds = run_options.lease_seconds(lease)
        allowed = allowed_clock_offset(lease_seconds)
        url = database_url(db)
        if url_backend(url) == "sqlite":  # (not opened: it would create a missing file)
            backend, reading = "sqlite", None
        else:  # (no migration: nothing is written)
            store = open_store(url, migrate=False)
            try:
                backend, reading = store.backend, store.clock_offset()
            finally:
                store.close()
        problem = clock_problem(reading, lease_seconds)
    doc = {
        "backend": backend,
        "offset_seconds": None if reading is None else -reading.offset,
        "uncertainty_seconds": None if reading is None else reading.uncertainty,
        "lease_seconds": lease_seconds,
        "allowed_seconds": allowed,
        "ok": not problem,
        "problem": problem or None,
    }
    if as_json:
        output.emit_json(doc)
    elif reading is None:
        output.out.print(f"{backend}: the database is on this host, one clock: nothing to check")
    elif problem:
        output.err.print(f"[bold red]clock too far off:[/] {problem}", highlight=False)
        output.err.print(f"[dim]hint:[/] {ClockSkewError.default_hint}")
    else:
        output.out.print(
            f"this host's clock is {-reading.offset:+.3f} s off the database server's "
            f"(± {reading.uncertainty * 1000:.1f} ms): within the {allowed:.2f} s a "
            f"lease of {lease_seconds:g} s allows"
        )
    if problem:
        raise typer.Exit(output.EXIT_FAILED)


@app.command("demo")
def demo(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Run on this database (sqlite:///path.db or postgresql://...) instead of a "
            "fresh SQLite file in the temporary directory; its jobs stay there. "
            "$AFFIDAVIT_DATABASE_URL is not used: the demo starts fresh unless told.",
            show_default=False,
        ),
    ] = None,
    lease: Annotated[
        float | None,
        run_options.lease_option(
            "How long a claim lasts without a heartbeat, which the recovery waits out",
            1.0,  # affidavit.demo.LEASE_SECONDS (imported on use: it registers the demo's tools)
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the refund agent end to end on a fresh embedded database in a temporary directory:
    one clean job, one killed mid-step and recovered, the real effects counted, the hash
    chains verified and a tampered copy caught.

    The recovery waits for the killed run's lease to expire: the demo's lease is 1 s unless
    --lease-seconds or $AFFIDAVIT_LEASE_SECONDS says otherwise. With --db, the tampered copy
    is an export of the job (events, ledger, seal) verified offline; the database is not
    touched.

    Exit codes: 0 every check held; 1 otherwise; 3 usage or store error.
    """
    from affidavit.cli.demo_view import render
    from affidavit.demo import LEASE_SECONDS, run_demo

    with command(as_json):
        lease_seconds = run_options.seconds_setting(
            lease, "AFFIDAVIT_LEASE_SECONDS", LEASE_SECONDS, zero_ok=False
        )
        run_options.lease_seconds(lease_seconds)  # finite
        url = database_url(db) if db is not None else None
        result = run_demo(db_url=url, lease_seconds=lease_seconds)
    if as_json:
        output.emit_json(result.to_dict())
    else:
        render(result)
    if not result.ok:
        raise typer.Exit(output.EXIT_FAILED)


def _reflowed(doc: str) -> str:
    """A docstring as help text: each paragraph on one line, so that the terminal, not the
    source's line breaks, decides where the help wraps."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _reflow_help(group: typer.Typer) -> None:
    """Give every command of ``group`` (and of its sub-groups) its docstring, reflowed, as help
    (Typer's rich mode keeps a docstring's single line breaks)."""
    for info in group.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback is not None else None)
        if doc:
            info.help = _reflowed(doc)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance)


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _broken_pipe(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the app and maps usage errors to exit code 3."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = load_commands(args)(args=args, standalone_mode=False)
    except SystemExit as exc:
        if exc.code == 1 and _broken_pipe(exc.__context__):
            # Click's exit for a reader that closed stdout early (`| head`): 1 means "failed"
            # here (a job, a check), so exit as a program stopped by SIGPIPE does
            raise SystemExit(EXIT_BROKEN_PIPE) from None
        raise
    except typer.Abort:
        raise SystemExit(130) from None
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument, ...
        show = getattr(exc, "show", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and show is not None:
            show()
            raise SystemExit(0) from None
        if "--json" in args:
            error = ConfigError(exc.format_message(), hint="Run with --help for usage.")
            output.emit_json({"error": error.to_dict()})
        elif show is not None:
            show()
        else:
            output.err.print(f"error: {exc.format_message()}")
        raise SystemExit(output.EXIT_USAGE_OR_STORE) from None
    raise SystemExit(code if isinstance(code, int) else 0)
