"""Argument policies: which options and modules each allowed program may be given.

A program name on the allow-list is not enough: ``python -m timeit -s CODE`` runs code,
``coverage erase --data-file=FILE`` deletes a file, ``pytest --junitxml=FILE`` overwrites one,
``ruff check --fix`` rewrites sources. Each allowed program has a policy, checked on the words
before anything runs:

1. code given on the command line or fetched at run time is refused unless the configuration
   allows inline code: ``python -c``, ``-m`` of a module outside ``allowed_modules`` (the same
   for ``coverage run -m``), pip's commands that install or change the environment;
2. options that rewrite the checked sources in place are refused (``ruff check --fix``,
   ``--add-noqa``, ``ruff format`` without ``--check``/``--diff``, ``black`` and ``isort``
   without a check or diff option, ``ruff clean``, ``coverage combine`` without ``--keep``,
   ``mypy --install-types``);
3. options that write or delete a file must name a path inside the sandbox's private scratch
   directory (``/tmp/...``): ``pytest --junitxml``, ``--basetemp``, ``--log-file``,
   ``coverage --data-file`` (for run, erase, combine), ``-o``/``-d`` of coverage's reports,
   ``--output-file``, ``--cache-dir``, mypy's reports, pip's ``--log``... Without the sandbox
   (``isolation="none"``) there is no private scratch directory, and these are refused.

Long options are matched as the program's own parser would: where it accepts an unambiguous
prefix (argparse's and optparse's default), any prefix of a policed option is read as that
option (``--data-f=FILE`` is ``--data-file``).

The result is a :class:`Refusal` naming the argument, or ``None``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SCRATCH = "/tmp"
DEFAULT_ALLOWED_MODULES = frozenset(
    {
        "pytest",
        "coverage",
        "mypy",
        "ruff",
        "black",
        "isort",
        "flake8",
        "bandit",
        "pip",
        "unittest",
    }
)
# pip subcommands that only read: anything else (install, uninstall, download, wheel, cache,
# config, ...) fetches and runs package code or changes the service's own environment.
PIP_READ_ONLY = frozenset({"list", "show", "freeze", "check", "help", "inspect", "hash"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a command is refused: the argument and the reason. ``inline`` marks code run from
    the command line (allowed only when the configuration allows inline code)."""

    argument: str
    reason: str
    inline: bool = False

    def message(self) -> str:
        tail = "; inline code is not allowed" if self.inline else ""
        return f"argument {self.argument!r}: {self.reason}{tail}"


@dataclass(frozen=True, slots=True)
class Context:
    """What a policy needs from the configuration."""

    allow_inline_code: bool
    allowed_modules: frozenset[str]
    sandboxed: bool


def check(argv: Sequence[str], ctx: Context) -> Refusal | None:
    """The first refused argument of ``argv`` (whose program is allow-listed), or ``None``."""
    policy = _POLICIES.get(_base(argv[0]))
    return policy(argv[0], list(argv[1:]), ctx) if policy is not None else None


def _base(program: str) -> str:
    if program.startswith("python"):
        return "python"
    if program.startswith("pip"):
        return "pip"
    return program


# --- helpers ------------------------------------------------------------------------------


def in_scratch(path: str) -> bool:
    """``path`` is an absolute path inside the sandbox's private scratch directory."""
    return os.path.isabs(path) and os.path.normpath(path).startswith(SCRATCH + "/")


def _match(name: str, options: frozenset[str], abbrev: bool) -> str | None:
    if name in options:
        return name
    if abbrev and name.startswith("--") and len(name) > 3:
        for option in sorted(options):
            if option.startswith(name):
                return option  # fail closed: any option the prefix could stand for
    return None


def _options(
    prog: str,
    args: Sequence[str],
    ctx: Context,
    *,
    writes: frozenset[str] = frozenset(),
    refused: dict[str, str] | None = None,
    abbrev: bool = True,
) -> Refusal | None:
    """Check every option word of ``args``: ``refused`` options are refused outright;
    ``writes`` options (which take a path) must name a path in the scratch directory."""
    refused = refused or {}
    banned = frozenset(refused)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return None
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            hit = _match(name, banned, abbrev)
            if hit is not None:
                return Refusal(word, refused[hit])
            hit = _match(name, writes, abbrev)
            if hit is not None:
                if not eq:
                    i += 1
                    value = args[i] if i < len(args) else ""
                problem = _write_problem(f"{prog} {hit}", value, ctx)
                if problem is not None:
                    return Refusal(word if eq else f"{word} {value}", problem)
        elif word.startswith("-") and len(word) > 1:
            short = word[:2]
            if short in banned:
                return Refusal(word, refused[short])
            if short in writes:
                value = word[2:]
                if not value:
                    i += 1
                    value = args[i] if i < len(args) else ""
                problem = _write_problem(f"{prog} {short}", value, ctx)
                if problem is not None:
                    return Refusal(word if word[2:] else f"{word} {value}", problem)
        i += 1
    return None


def _write_problem(option: str, path: str, ctx: Context) -> str | None:
    if not ctx.sandboxed:
        return (
            f"`{option}` writes a file, and without the sandbox there is no private scratch "
            "directory to write it to"
        )
    if not in_scratch(path):
        return (
            f"`{option}` writes {path!r}, outside the sandbox's scratch directory "
            f"(give a path under {SCRATCH}/)"
        )
    return None


def _at(args: Sequence[str], i: int) -> str:
    return args[i] if i < len(args) else ""


def _first_word(args: Sequence[str]) -> str | None:
    for word in args:
        if not word.startswith("-"):
            return word
    return None


# --- python and its modules ----------------------------------------------------------------


def _python(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    """Walk the interpreter's own options (up to the script or module)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or word == "-" or not word.startswith("-"):
            return None  # a script (or stdin, which is /dev/null) follows: not inline code
        if word.startswith("--"):
            i += 2 if word == "--check-hash-based-pycs" else 1
            continue
        letters = word[1:]
        for j, letter in enumerate(letters):
            if letter == "c":
                if ctx.allow_inline_code:
                    return None
                return Refusal(word, f"`{prog} -c` runs code given on the command line", True)
            if letter == "m":
                module = letters[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                rest = args[i + 1 :] if letters[j + 1 :] else args[i + 2 :]
                return module_policy(f"{prog} -m", module, rest, ctx)
            if letter in "WX":  # options with a value: the rest of the word, or the next word
                if j == len(letters) - 1:
                    i += 1
                break
        i += 1
    return None


def module_policy(prefix: str, module: str, args: list[str], ctx: Context) -> Refusal | None:
    """``-m module args``: the module must be allowed, and its arguments pass its policy."""
    if not ctx.allow_inline_code and module not in ctx.allowed_modules:
        allowed = ", ".join(sorted(ctx.allowed_modules))
        return Refusal(
            f"-m {module}",
            f"`{prefix} {module}` runs a module that is not allowed (allowed: {allowed})",
            True,
        )
    policy = _POLICIES.get(module)
    return policy(f"{prefix} {module}", args, ctx) if policy is not None else None


# --- the tools ------------------------------------------------------------------------------

_PIP_WRITES = frozenset({"--log", "--log-file", "--cache-dir", "--report"})


def _pip(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    """pip may only read: its first word that is not an option is the subcommand (an option's
    value read as one is refused too — fail closed)."""
    sub, i = None, 0
    while i < len(args):  # the first word that is neither an option nor a known option's value
        word = args[i]
        if not word.startswith("-"):
            sub = word
            break
        i += 2 if word in _PIP_WRITES else 1
    if sub is not None and sub not in PIP_READ_ONLY and not ctx.allow_inline_code:
        return Refusal(
            sub, f"`{prog} {sub}` fetches and runs package code or changes the environment", True
        )
    return _options(prog, args, ctx, writes=_PIP_WRITES)


_PYTEST_WRITES = frozenset(
    {
        "--junitxml",
        "--junit-xml",
        "--basetemp",
        "--log-file",
        "--resultlog",
        "--result-log",
        "--report-log",
        "--debug",
        "--html",
        "--json-report-file",
        "--cov-report",
    }
)
_PYTEST_INI_WRITES = ("cache_dir", "log_file", "junit_", "tmp_path_")


def _pytest(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    for i, word in enumerate(args):
        if word == "--":
            break
        value = None
        if word in ("-o", "--override-ini"):
            value = args[i + 1] if i + 1 < len(args) else ""
        elif word.startswith("--override-ini="):
            value = word.partition("=")[2]
        elif word.startswith("-o") and len(word) > 2:
            value = word[2:]
        if value is not None and value.split("=", 1)[0].strip().startswith(_PYTEST_INI_WRITES):
            return Refusal(value, f"`{prog} -o {value}` sets where pytest writes files")
        if word == "--cov-report" or word.startswith("--cov-report="):
            # terminal reports print; file reports (xml:PATH, html:DIR, ...) write
            report = word.partition("=")[2] if "=" in word else _at(args, i + 1)
            kind, colon, path = report.partition(":")
            if kind in ("xml", "html", "json", "lcov", "annotate") and not (
                colon and in_scratch(path) and ctx.sandboxed
            ):
                shown = path if colon else f"its default {kind} file"
                return Refusal(word, f"`{prog} --cov-report` writes {shown!r} outside {SCRATCH}/")
    policed = _PYTEST_WRITES - {"--cov-report", "--debug"}
    found = _options(prog, args, ctx, writes=policed, abbrev=False)
    if found is not None:
        return found
    for word in args:  # --debug prints; --debug=FILE writes
        if word.startswith("--debug="):
            problem = _write_problem(f"{prog} --debug", word.partition("=")[2], ctx)
            if problem is not None:
                return Refusal(word, problem)
    return None


_COVERAGE_RUN_VALUES = frozenset(
    {"--data-file", "--rcfile", "--source", "--include", "--omit", "--context", "--concurrency"}
)
_COVERAGE_REPORT_WRITES = {
    "xml": frozenset({"-o"}),
    "json": frozenset({"-o"}),
    "lcov": frozenset({"-o"}),
    "html": frozenset({"-d", "--directory"}),
    "annotate": frozenset({"-d", "--directory"}),
}


def _coverage(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    sub = _first_word(args)
    if sub is None:
        return None
    at = args.index(sub)
    rest = args[at + 1 :]
    if sub == "run":
        # The options up to the script or ``-m module``; what follows is the program's own.
        writes = frozenset({"--data-file"})
        i = 0
        while i < len(rest):
            word = rest[i]
            if word == "-m" or word == "--module":
                found = _options(f"{prog} run", rest[:i], ctx, writes=writes)
                return found or module_policy(
                    f"{prog} run -m", _at(rest, i + 1), rest[i + 2 :], ctx
                )
            if not word.startswith("-"):
                return _options(f"{prog} run", rest[:i], ctx, writes=writes)
            i += 2 if word in _COVERAGE_RUN_VALUES else 1
        return _options(f"{prog} run", rest, ctx, writes=writes)
    if sub == "combine" and "--keep" not in rest:
        return Refusal(sub, f"`{prog} combine` deletes the data files it combines (use --keep)")
    if sub in ("erase", "combine"):
        return _options(f"{prog} {sub}", rest, ctx, writes=frozenset({"--data-file"}))
    report = _COVERAGE_REPORT_WRITES.get(sub)
    if report is not None:
        found = _options(f"{prog} {sub}", rest, ctx, writes=report)
        if found is not None:
            return found
        if not any(w in report or w.split("=")[0] in report or w[:2] in report for w in rest):
            if ctx.sandboxed:
                return None  # the default file goes to the working directory: read-only
            return Refusal(sub, f"`{prog} {sub}` writes its report into the working directory")
    return None


_FIXING = "rewrites the checked sources in place"


def _ruff(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    sub = _first_word(args)
    if sub == "clean":
        return Refusal(sub, f"`{prog} clean` deletes cache directories")
    if sub == "format" and not {"--check", "--diff"} & set(args):
        return Refusal(sub, f"`{prog} format` without --check or --diff {_FIXING}")
    return _options(
        prog,
        args,
        ctx,
        writes=frozenset({"--output-file", "-o", "--cache-dir"}),
        refused={
            "--fix": _FIXING,
            "--fix-only": _FIXING,
            "--unsafe-fixes": _FIXING,
            "--add-noqa": _FIXING,
        },
        abbrev=False,
    )


def _black(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    if not {"--check", "--diff"} & set(args) and not any(a.startswith("-c") for a in args):
        return Refusal(prog, f"`{prog}` without --check or --diff {_FIXING}")
    return None


def _isort(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    checks = {"--check-only", "--check", "-c", "--diff", "--stdout"}
    if not checks & set(args):
        return Refusal(prog, f"`{prog}` without --check-only or --diff {_FIXING}")
    return None


def _flake8(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    return _options(prog, args, ctx, writes=frozenset({"--output-file"}))


def _bandit(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    return _options(prog, args, ctx, writes=frozenset({"-o", "--output"}))


_MYPY_WRITES = frozenset(
    {
        "--cache-dir",
        "--junit-xml",
        "--any-exprs-report",
        "--cobertura-xml-report",
        "--html-report",
        "--linecount-report",
        "--linecoverage-report",
        "--lineprecision-report",
        "--memory-xml-report",
        "--txt-report",
        "--xml-report",
        "--xslt-html-report",
        "--xslt-txt-report",
    }
)


def _mypy(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    return _options(
        prog,
        args,
        ctx,
        writes=_MYPY_WRITES,
        refused={"--install-types": "installs packages (runs pip install)"},
    )


def _safety(prog: str, args: list[str], ctx: Context) -> Refusal | None:
    return _options(
        prog, args, ctx, writes=frozenset({"--save-json", "--save-html", "--save-spdx"})
    )


_POLICIES: dict[str, Callable[[str, list[str], Context], Refusal | None]] = {
    "python": _python,
    "pip": _pip,
    "pytest": _pytest,
    "coverage": _coverage,
    "ruff": _ruff,
    "black": _black,
    "isort": _isort,
    "flake8": _flake8,
    "bandit": _bandit,
    "mypy": _mypy,
    "safety": _safety,
}
