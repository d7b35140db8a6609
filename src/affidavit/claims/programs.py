"""The argument policy of each allowed program, as data: one table per program.

Each table lists what a claim may give the program — its options with the shape of their
values, its positional arguments, its subcommands — and :func:`affidavit.claims.argspec.walk`
refuses everything else. A claim checks the project, it never changes it: options that run code
given on the command line, rewrite sources, install packages or write outside the sandbox's
scratch directory are not in the tables. Adding a program (or an option) touches one table.
"""

from __future__ import annotations

import os
import shlex

from affidavit.claims.argspec import (
    CODES,
    GLOBS,
    IDENT,
    TEXT,
    WARNING_FILTER,
    Context,
    MaybeValue,
    Refusal,
    Shape,
    Spec,
    Tail,
    Value,
    either,
    flags,
    integer,
    names,
    node_id,
    number,
    pattern,
    project_file,
    project_path,
    scratch_path,
    valued,
    walk,
)

# --- python: the interpreter, its modules and its scripts ------------------------------------


def _inline(prog: str, name: str, value: str, rest: list[str], ctx: Context) -> Refusal | None:
    if ctx.allow_inline_code:
        return None
    return Refusal(
        f"{name} {value}"[:80], f"`{prog} {name}` runs code given on the command line", True
    )


def module_policy(prefix: str, module: str, args: list[str], ctx: Context) -> Refusal | None:
    """``-m module args``: the module must be allowed, and its arguments pass its table."""
    if not ctx.allow_inline_code and module not in ctx.allowed_modules:
        allowed = ", ".join(sorted(ctx.allowed_modules))
        return Refusal(
            f"-m {module}",
            f"`{prefix} {module}` runs a module that is not allowed (allowed: {allowed})",
            True,
        )
    spec = PROGRAMS.get(module)
    return walk(spec, f"{prefix} {module}", args, ctx) if spec is not None else None


def _module(prog: str, name: str, value: str, rest: list[str], ctx: Context) -> Refusal | None:
    return module_policy(f"{prog} -m", value, rest, ctx)


def _script(prog: str, word: str, value: str, rest: list[str], ctx: Context) -> Refusal | None:
    """A script of the project runs with its own arguments; a file of the interpreter's own
    library (``timeit.py``, ``pdb.py``, a tool's ``__main__.py``) is not the project's."""
    if ctx.allow_inline_code:
        return None
    problem = project_path(value, ctx)
    if problem is not None:
        return Refusal(value, f"`{prog}` runs a script that {problem}", True)
    return None


_X_OPTIONS = names(
    "dev",
    "utf8",
    "utf8=0",
    "utf8=1",
    "faulthandler",
    "importtime",
    "tracemalloc",
    "warn_default_encoding",
    "no_debug_ranges",
    "frozen_modules=on",
    "frozen_modules=off",
)
PYTHON = Spec(
    options={
        **flags("-b -B -d -E -I -O -P -q -R -s -S -u -v -x -h -V --help --version"),
        "-W": WARNING_FILTER,
        "-X": _X_OPTIONS,
        "--check-hash-based-pycs": names("default", "always", "never"),
        "-c": Tail(_inline),
        "-m": Tail(_module),
    },
    positional=Tail(_script),
)

# --- pytest -----------------------------------------------------------------------------------

_COV_REPORT = pattern(r"(term|term-missing)(:skip-covered)?", "a terminal report")


def _cov_report(value: str, ctx: Context) -> str | None:
    kind, colon, path = value.partition(":")
    if kind in ("xml", "html", "json", "lcov", "annotate"):
        if not colon:
            return f"writes its {kind} report into the working directory (give {kind}:/tmp/...)"
        return scratch_path(path, ctx)
    return _COV_REPORT(value, ctx)


def _cov(value: str, ctx: Context) -> str | None:
    """``--cov[=SOURCE]``: measures a package or a path of the project."""
    if not ctx.sandboxed:
        return "writes its data file into the working directory, and there is no sandbox"
    return None if value == "" else either(IDENT, project_path)(value, ctx)


def _ini(value: str, ctx: Context) -> str | None:
    key, eq, setting = value.partition("=")
    key, setting = key.strip(), setting.strip()
    if not eq:
        return f"takes NAME=VALUE, not {value!r}"
    if key == "addopts":
        try:
            words = shlex.split(setting)
        except ValueError as exc:
            return f"cannot split addopts {setting!r}: {exc}"
        found = walk(PYTEST, "pytest (addopts)", words, ctx)
        return None if found is None else f"sets addopts with {found.message()}"
    shape = _PYTEST_INI.get(key)
    if shape is None:
        allowed = ", ".join(sorted({"addopts", *_PYTEST_INI}))
        return f"sets {key!r}, which a claim may not set (allowed: {allowed})"
    return shape(setting, ctx)


def _paths(value: str, ctx: Context) -> str | None:
    for word in value.split():
        problem = project_path(word, ctx)
        if problem is not None:
            return problem
    return None


_BOOL = names("true", "false", "True", "False", "1", "0")
_LOG_LEVEL = names("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "debug", "info", "warning")
_SPACED_GLOBS = pattern(r"[A-Za-z0-9_.*?/\-,\[\]! ]*", "file patterns")
_PYTEST_INI: dict[str, Shape] = {
    "python_files": _SPACED_GLOBS,
    "python_classes": _SPACED_GLOBS,
    "python_functions": _SPACED_GLOBS,
    "norecursedirs": _SPACED_GLOBS,
    "testpaths": _paths,
    "xfail_strict": _BOOL,
    "log_cli": _BOOL,
    "log_level": _LOG_LEVEL,
    "log_cli_level": _LOG_LEVEL,
    "console_output_style": names("classic", "progress", "count", "progress-even-when-capture-no"),
    "empty_parameter_set_mark": names("skip", "xfail", "fail_at_collect"),
}
PYTEST = Spec(
    options={
        **flags(
            "-q -v -x -s -l -h -V --quiet --verbose --exitfirst --showlocals --help --version "
            "--co --collect-only --lf --last-failed --ff --failed-first --nf --new-first "
            "--sw --stepwise --sw-skip --stepwise-skip --strict-markers --strict-config "
            "--strict --disable-warnings --disable-pytest-warnings --doctest-modules "
            "--doctest-continue-on-collection-errors --continue-on-collection-errors "
            "--no-header --no-summary --full-trace --fixtures --fixtures-per-test --markers "
            "--setup-only --setup-show --setup-plan --runxfail --cache-clear --no-cov "
            "--cov-branch --cov-append --trace-config --pastebin-off"
        ),
        "--tb": names("auto", "long", "short", "line", "native", "no"),
        "--capture": names("fd", "sys", "no", "tee-sys"),
        "-r": pattern(r"[fEsxXpPaAwN]+", "report characters (fEsxXpPaAwN)"),
        **valued(integer, "--maxfail --durations"),
        "--durations-min": number,
        "--timeout": number,
        **valued(TEXT, "-k -m"),
        "--deselect": node_id,
        "--ignore": project_path,
        "--ignore-glob": GLOBS,
        "--import-mode": names("prepend", "append", "importlib"),
        "--color": names("yes", "no", "auto"),
        "--code-highlight": names("yes", "no"),
        **valued(_LOG_LEVEL, "--log-level --log-cli-level"),
        **valued(either(integer, names("auto", "logical")), "-n --numprocesses"),
        "--dist": names("no", "load", "loadscope", "loadfile", "loadgroup", "worksteal", "each"),
        "-p": pattern(r"no:[A-Za-z0-9_.\-]+", "no:PLUGIN (disabling a plugin)"),
        **valued(_ini, "-o --override-ini"),
        **valued(project_path, "-c --config-file --rootdir --confcutdir --cov-config"),
        **valued(WARNING_FILTER, "-W --pythonwarnings"),
        **valued(
            scratch_path,
            "--junitxml --junit-xml --basetemp --log-file --report-log --debug --html "
            "--json-report-file",
        ),
        "--cov": MaybeValue(_cov),
        "--cov-report": _cov_report,
        "--cov-fail-under": number,
    },
    positional=node_id,
)

# --- coverage ---------------------------------------------------------------------------------

_DATA_FILE = valued(scratch_path, "--data-file")
_RCFILE = valued(project_path, "--rcfile")
_REPORTING: dict[str, Value] = {
    **flags("-i --ignore-errors --skip-covered --no-skip-covered --skip-empty -q --quiet"),
    **flags("--show-contexts -h --help"),
    **valued(GLOBS, "--include --omit"),
    **valued(TEXT, "--contexts --title"),
    "--data-file": either(scratch_path, project_path),
    "--fail-under": number,
    "--precision": integer,
    **_RCFILE,
}
_REPORT_WRITES_DEFAULT = "writes its report into the working directory"


def _coverage_report(writes: dict[str, Value], extra: str = "") -> Spec:
    """A report command; one with an output option writes its file into the working
    directory unless given one (refused without the sandbox: there it is the project)."""
    return Spec(
        options={**_REPORTING, **writes, **flags(extra)},
        positional=project_path,
        writes_by_default=_REPORT_WRITES_DEFAULT if writes else "",
    )


def _coverage_module(
    prog: str, name: str, value: str, rest: list[str], ctx: Context
) -> Refusal | None:
    return module_policy(f"{prog} -m", value, rest, ctx)


COVERAGE = Spec(
    options=flags("-h --help --version"),
    subcommands={
        "run": Spec(
            options={
                **flags("-a --append -p --parallel-mode -L --pylib --branch --timid -h --help"),
                **valued(IDENT, "--concurrency"),
                **valued(TEXT, "--context"),
                **valued(GLOBS, "--include --omit --source"),
                **_DATA_FILE,
                **_RCFILE,
                "-m": Tail(_coverage_module),
                "--module": Tail(_coverage_module),
            },
            positional=Tail(_script),
            writes_by_default="writes its data file into the working directory",
        ),
        "report": _coverage_report(
            {"--format": names("text", "markdown", "total"), "--sort": IDENT},
            "-m --show-missing",
        ),
        "xml": _coverage_report(valued(scratch_path, "-o")),
        "json": _coverage_report(valued(scratch_path, "-o"), "--pretty-print"),
        "lcov": _coverage_report(valued(scratch_path, "-o")),
        "html": _coverage_report(valued(scratch_path, "-d --directory"), "--skip-covered"),
        "annotate": _coverage_report(valued(scratch_path, "-d --directory")),
        "erase": Spec(options={**_DATA_FILE, **_RCFILE, **flags("-h --help")}),
        "combine": Spec(
            options={**_DATA_FILE, **_RCFILE, **flags("--keep -a --append -q --quiet")},
            positional=project_path,
            required=frozenset({"--keep"}),
            required_reason="deletes the data files it combines (use --keep)",
            writes_by_default="writes its data file into the working directory",
        ),
        "debug": Spec(positional=names("sys", "config", "data", "premain", "pybehave")),
        "help": Spec(positional=IDENT),
    },
)

# --- linters and formatters (checking only) ---------------------------------------------------

_FIXING = "rewrites the checked sources in place"
_RUFF_COMMON: dict[str, Value] = {
    **flags("-q --quiet -s --silent -v --verbose --isolated --no-cache -h --help"),
    "--config": project_file,  # a TOML file of the project; inline `KEY = VALUE` is refused
    "--cache-dir": scratch_path,
}
RUFF = Spec(
    options={**_RUFF_COMMON, **flags("-V --version")},
    subcommands={
        "check": Spec(
            options={
                **_RUFF_COMMON,
                **flags(
                    "--no-fix --diff -e --exit-zero --statistics --show-files --show-settings "
                    "--preview --no-preview --force-exclude --no-force-exclude "
                    "--respect-gitignore --no-respect-gitignore --exit-non-zero-on-fix "
                    "--no-unsafe-fixes --show-fixes --no-show-fixes"
                ),
                **valued(CODES, "--select --ignore --extend-select --extend-ignore --fixable"),
                **valued(CODES, "--unfixable --extend-fixable"),
                **valued(GLOBS, "--exclude --extend-exclude"),
                "--output-format": names(
                    "concise",
                    "full",
                    "json",
                    "json-lines",
                    "junit",
                    "grouped",
                    "github",
                    "gitlab",
                    "pylint",
                    "rdjson",
                    "azure",
                    "sarif",
                    "text",
                ),
                **valued(scratch_path, "-o --output-file"),
                "--target-version": pattern(r"py3[0-9]{1,2}", "a version such as py311"),
                "--line-length": integer,
            },
            positional=project_path,
            refused=dict.fromkeys(
                ["--fix", "--fix-only", "--unsafe-fixes", "--add-noqa", "--watch"], _FIXING
            ),
        ),
        "format": Spec(
            options={
                **_RUFF_COMMON,
                **flags("--check --diff --preview --no-preview --force-exclude"),
                **valued(GLOBS, "--exclude"),
                "--line-length": integer,
                "--target-version": pattern(r"py3[0-9]{1,2}", "a version such as py311"),
            },
            positional=project_path,
            required=frozenset({"--check", "--diff"}),
            required_reason=f"without --check or --diff {_FIXING}",
        ),
        "rule": Spec(options=flags("--all"), positional=CODES),
        "version": Spec(),
        "linter": Spec(),
    },
    other_subcommand="is not a subcommand a claim may run (`ruff clean` deletes caches)",
)

_CHECK_ONLY = f"without --check or --diff {_FIXING}"
BLACK = Spec(
    options={
        **flags("--check --diff --color --no-color -q --quiet -v --verbose --fast --safe"),
        **flags("--preview -S --skip-string-normalization -C --skip-magic-trailing-comma"),
        **valued(integer, "-l --line-length"),
        **valued(pattern(r"py3[0-9]{1,2}", "a version such as py311"), "-t --target-version"),
        **valued(TEXT, "--include --exclude --extend-exclude --force-exclude"),
        "--config": project_path,
        **valued(TEXT, "-c --code"),  # formats the text and prints it: nothing runs
        **flags("-h --help --version"),
    },
    positional=project_path,
    required=frozenset({"--check", "--diff", "-c", "--code"}),
    required_reason=_CHECK_ONLY,
)
ISORT = Spec(
    options={
        **flags("--check-only --check -c --diff --df --stdout --color -q --quiet -v"),
        **flags("--verbose --filter-files --show-files --only-modified -h --help"),
        "--profile": names("black", "django", "pycharm", "google", "open_stack", "plone"),
        **valued(integer, "-l --line-length --line-width"),
        **valued(project_path, "--settings-path --sp --settings-file --settings --skip"),
        **valued(GLOBS, "--skip-glob"),
    },
    positional=project_path,
    required=frozenset({"--check-only", "--check", "-c", "--diff", "--df", "--stdout"}),
    required_reason=f"without --check-only or --diff {_FIXING}",
)
FLAKE8 = Spec(
    options={
        **flags("--count --statistics -q --quiet -v --verbose --exit-zero --show-source"),
        **flags("--no-show-source -h --help --version --isolated --doctests"),
        **valued(CODES, "--select --ignore --extend-ignore --extend-select"),
        **valued(integer, "--max-line-length --max-complexity --max-doc-length"),
        **valued(GLOBS, "--exclude --extend-exclude --filename"),
        "--format": names("default", "pylint", "quiet-filename", "quiet-nothing"),
        "-j": either(integer, names("auto")),
        "--jobs": either(integer, names("auto")),
        "--config": project_path,
        "--output-file": scratch_path,
    },
    positional=project_path,
)
BANDIT = Spec(
    options={
        **flags("-r --recursive -q --quiet -v --verbose --exit-zero -l -i -h --help --version"),
        **valued(names("csv", "custom", "html", "json", "screen", "txt", "xml", "yaml"), "-f"),
        "--format": names("csv", "custom", "html", "json", "screen", "txt", "xml", "yaml"),
        **valued(scratch_path, "-o --output"),
        **valued(CODES, "-s --skip -t --tests"),
        **valued(project_path, "-c --configfile --ini -b --baseline"),
        **valued(GLOBS, "-x --exclude"),
        **valued(names("file", "vuln"), "-a --aggregate"),
        "-n": integer,
        **valued(names("all", "low", "medium", "high"), "--severity-level --confidence-level"),
    },
    positional=project_path,
)

# --- mypy -------------------------------------------------------------------------------------

_MYPY_FLAGS = flags(
    "--strict --ignore-missing-imports --no-incremental --incremental --pretty "
    "--show-error-codes --hide-error-codes --show-error-context --show-column-numbers "
    "--show-error-end --show-absolute-path --show-traceback --no-error-summary "
    "--error-summary --no-color-output --color-output --check-untyped-defs "
    "--disallow-untyped-defs --disallow-incomplete-defs --disallow-untyped-calls "
    "--disallow-any-generics --disallow-subclassing-any --disallow-untyped-decorators "
    "--disallow-any-unimported --disallow-any-expr --disallow-any-decorated "
    "--disallow-any-explicit --no-implicit-optional --implicit-optional "
    "--warn-unused-ignores --warn-redundant-casts --warn-return-any --warn-unreachable "
    "--warn-unused-configs --warn-no-return --no-warn-no-return --no-implicit-reexport "
    "--strict-equality --strict-optional --no-strict-optional --extra-checks "
    "--explicit-package-bases --namespace-packages --no-namespace-packages "
    "--no-site-packages --follow-untyped-imports --local-partial-types --allow-redefinition "
    "--allow-untyped-globals --no-silence-site-packages --non-interactive "
    "--warn-incomplete-stub --sqlite-cache --skip-version-check "
    "--skip-cache-mtime-checks -v --verbose -h --help -V --version"
)
MYPY = Spec(
    options={
        **_MYPY_FLAGS,
        "--python-version": pattern(r"3\.[0-9]{1,2}", "a version such as 3.11"),
        "--platform": IDENT,
        "--soft-error-limit": integer,
        "--follow-imports": names("normal", "silent", "skip", "error"),
        **valued(project_path, "--config-file"),
        **valued(TEXT, "--exclude --always-true --always-false --enable-error-code"),
        **valued(TEXT, "--disable-error-code --enable-incomplete-feature"),
        **valued(IDENT, "-p --package -m --module"),
        **valued(
            scratch_path,
            "--cache-dir --junit-xml --any-exprs-report --cobertura-xml-report --html-report "
            "--linecount-report --linecoverage-report --lineprecision-report "
            "--memory-xml-report --txt-report --xml-report --xslt-html-report "
            "--xslt-txt-report",
        ),
    },
    positional=project_path,  # `@FILE` (arguments read from a file) is not a path here
    refused={"--install-types": "installs packages (runs pip install)"},
)

# --- unittest ---------------------------------------------------------------------------------


def _test_name(value: str, ctx: Context) -> str | None:
    """A test module, class or method of the project (``tests.test_x.Case``) or a path: a
    dotted name must start with a module or package of the project (``unittest timeit``
    would import the standard library's)."""
    if "/" in value or value.endswith(".py"):
        return project_path(value, ctx)
    if IDENT(value, ctx) is not None:
        return f"is not a test name: {value!r}"
    head = value.split(".", 1)[0]
    if ctx.project is not None and any(
        project_path(c, ctx) is None and os.path.exists(os.path.join(ctx.project, c))
        for c in (head, head + ".py")
    ):
        return None
    return f"names {value!r}, which is not a module of the project"


def _unittest(prog: str, word: str, value: str, rest: list[str], ctx: Context) -> Refusal | None:
    if value == "discover":
        return walk(UNITTEST_DISCOVER, f"{prog} discover", rest, ctx)
    problem = _test_name(value, ctx)
    if problem is not None:
        return Refusal(value, f"`{prog}` {problem}")
    return walk(UNITTEST_NAMES, prog, rest, ctx)


_UNITTEST_OPTIONS: dict[str, Value] = {
    **flags("-v --verbose -q --quiet -f --failfast -c --catch -b --buffer --locals -h --help"),
    "-k": TEXT,
    "--durations": integer,
}
UNITTEST = Spec(options=_UNITTEST_OPTIONS, positional=Tail(_unittest))
UNITTEST_NAMES = Spec(options=_UNITTEST_OPTIONS, positional=_test_name)
UNITTEST_DISCOVER = Spec(
    options={
        **_UNITTEST_OPTIONS,
        **valued(project_path, "-s --start-directory -t --top-level-directory"),
        **valued(GLOBS, "-p --pattern"),
    },
    positional=either(project_path, GLOBS),
)

# --- pip (reading only) and safety ------------------------------------------------------------

_PIP_GENERAL: dict[str, Value] = {
    **flags("-q --quiet -v --verbose --isolated --no-input --disable-pip-version-check"),
    **flags("--no-color --no-cache-dir --require-virtualenv -h --help -V --version"),
    **valued(scratch_path, "--log --log-file --cache-dir"),
}
_PACKAGE = pattern(r"[A-Za-z0-9][A-Za-z0-9._\-]*", "a package name")


def _pip_sub(extra: dict[str, Value], positional: Shape | None = None) -> Spec:
    return Spec(options={**_PIP_GENERAL, **extra}, positional=positional)


PIP = Spec(
    options=_PIP_GENERAL,
    subcommands={
        "list": _pip_sub(
            {
                **flags("-o --outdated -u --uptodate -e --editable -l --local --user --pre"),
                **flags("--not-required --exclude-editable --include-editable"),
                "--format": names("columns", "freeze", "json"),
                "--exclude": _PACKAGE,
            }
        ),
        "show": _pip_sub(flags("-f --files"), _PACKAGE),
        "freeze": _pip_sub(
            {**flags("--all -l --local --user --exclude-editable"), "--exclude": _PACKAGE}
        ),
        "check": _pip_sub({}),
        "inspect": _pip_sub(flags("--local --user")),
        "hash": _pip_sub(
            {**valued(names("sha256", "sha384", "sha512"), "-a --algorithm")}, project_path
        ),
        "help": _pip_sub({}, IDENT),
    },
    other_subcommand="fetches and runs package code or changes the environment",
    other_subcommand_inline=True,
)
SAFETY = Spec(
    options=flags("-h --help --version"),
    subcommands={
        "check": Spec(
            options={
                **flags("--json --full-report --short-report --bare --continue-on-error"),
                **valued(project_path, "-r --file --policy-file --db"),
                **valued(names("screen", "text", "json", "bare", "html"), "--output"),
                **valued(scratch_path, "--save-json --save-html --save-spdx"),
                **valued(pattern(r"[0-9]{1,12}", "a vulnerability id"), "-i --ignore"),
            }
        ),
    },
)

PROGRAMS: dict[str, Spec] = {
    "python": PYTHON,
    "pytest": PYTEST,
    "coverage": COVERAGE,
    "ruff": RUFF,
    "black": BLACK,
    "isort": ISORT,
    "flake8": FLAKE8,
    "bandit": BANDIT,
    "mypy": MYPY,
    "unittest": UNITTEST,
    "pip": PIP,
    "safety": SAFETY,
}
