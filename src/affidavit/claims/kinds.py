"""What each claim type may run: a claim is only evidence if its command could have shown it
false.

The allow-list and the argument policies (:mod:`affidavit.claims.sandbox`,
:mod:`affidavit.claims.policy`) say what may run at all. On top of them, a claim's type says
which of those programs can prove it:

1. a ``test_result`` claim runs a **test runner**: ``pytest``, ``python -m pytest``,
   ``python -m unittest`` (``python3`` too, after any interpreter options), or
   ``coverage run -m pytest|unittest``;
2. a ``performance_metric`` claim, and any claim with ``metrics``, runs a **measuring
   program**: a test runner, a project file run by ``python``/``python3`` (``python bench.py``),
   ``python -m`` of a test runner or an analyser, ``coverage``, or an analyser (``mypy``,
   ``ruff``, ``flake8``, ``bandit``, ``safety``, ``black``, ``isort``). Never inline code
   (``python -c`` prints what it is given, even where the configuration allows it), and never
   a program whose output is its own arguments or a file it is pointed at (``echo``,
   ``printf``, ``cat``, ``head``, ``tail``, ``ls``...): such a program prints the claim it was
   given, so its "measurement" is always accurate;
3. the other types (``code_quality``, ``security_finding``, ``deployment_status``, ``custom``)
   without ``metrics`` run any allowed program.

A refusal is :class:`CommandUnfitForClaim` (a :class:`CommandNotAllowed`: CLI exit 5, HTTP 422),
raised before anything runs or is written.
"""

from __future__ import annotations

from collections.abc import Sequence

from affidavit.claims.compare import ClaimRules
from affidavit.claims.model import ClaimType
from affidavit.core.errors import CommandNotAllowed

TEST_MODULES = frozenset({"pytest", "unittest"})
ANALYSERS = frozenset({"mypy", "ruff", "flake8", "bandit", "safety", "black", "isort"})
MEASURING_MODULES = TEST_MODULES | ANALYSERS | {"coverage"}
PYTHONS = frozenset({"python", "python3"})
# a test runner's modes that run no test (they print help, a version or the test names)
NO_TESTS = frozenset(
    {"-h", "--help", "-V", "--version", "--co", "--collect-only", "--fixtures", "--markers"}
)
# coverage run's options that take a value
_COVERAGE_VALUED = frozenset(
    {"--data-file", "--rcfile", "--source", "--include", "--omit", "--context", "--concurrency"}
)
# interpreter options that take a value (the rest of the word, or the next word)
_VALUED_LETTERS = "WX"

RUNNERS_HINT = (
    "Run the tests: `pytest ...`, `python -m pytest ...`, `python -m unittest ...` or "
    "`coverage run -m pytest ...`."
)
MEASURING_HINT = (
    "Measure with the project's own code: a script (`python bench.py`), a test runner "
    "(`pytest ...`), coverage or an analyser; a program that prints what it is given proves "
    "nothing."
)


class CommandUnfitForClaim(CommandNotAllowed):
    """The command is allowed, but it cannot prove a claim of this type."""

    code = "command_unfit_for_claim"
    default_hint = MEASURING_HINT


def check(kind: ClaimType, rules: ClaimRules, argv: Sequence[str]) -> None:
    """Refuse ``argv`` (a command that passed the allow-list) for a claim of type ``kind``
    with ``rules`` unless it is a program that can prove such a claim (module contract).

    Raises:
        CommandUnfitForClaim: it cannot; nothing has run.
    """
    program = argv[0]
    if kind is ClaimType.TEST_RESULT:
        if not runs_tests(argv):
            raise CommandUnfitForClaim(
                f"a test_result claim must run a test runner; `{_shown(argv)}` does not",
                hint=RUNNERS_HINT,
            )
        return
    if kind is ClaimType.PERFORMANCE_METRIC or rules.metrics is not None:
        what = (
            "a performance_metric claim"
            if kind is ClaimType.PERFORMANCE_METRIC
            else "a claim with metrics"
        )
        if program in PYTHONS and _python_target(argv[1:]) == ("inline", ""):
            raise CommandUnfitForClaim(
                f"{what} cannot be proven by inline code (`{program} -c`): it prints what it "
                "is given"
            )
        if not measures(argv):
            raise CommandUnfitForClaim(
                f"{what} cannot be proven by `{program}`: it is not a measuring program "
                "(its output is what it is given, not a measurement of the project)"
            )


def runs_tests(argv: Sequence[str]) -> bool:
    """``argv`` runs a test runner (rule 1)."""
    program, args = argv[0], list(argv[1:])
    if NO_TESTS & set(args):
        return False
    if program == "pytest":
        return True
    if program in PYTHONS:
        how, target = _python_target(args)
        return how == "module" and target in TEST_MODULES
    if program == "coverage":
        return _coverage_runs(args)
    return False


def measures(argv: Sequence[str]) -> bool:
    """``argv`` runs a measuring program (rule 2)."""
    program, args = argv[0], list(argv[1:])
    if program == "pytest" or program == "coverage" or program in ANALYSERS:
        return True
    if program in PYTHONS:
        how, target = _python_target(args)
        return how == "file" or (how == "module" and target in MEASURING_MODULES)
    return False


def _python_target(args: Sequence[str]) -> tuple[str, str]:
    """What the interpreter runs: ``("module", name)``, ``("file", path)``, ``("inline", "")``
    or ``("nothing", "")`` (standard input, which is ``/dev/null``, or no argument)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "-" or word == "--":
            return "nothing", ""
        if not word.startswith("-"):
            return "file", word
        if word.startswith("--"):
            i += 2 if word == "--check-hash-based-pycs" else 1
            continue
        letters = word[1:]
        for j, letter in enumerate(letters):
            if letter == "c":
                return "inline", ""
            if letter == "m":
                module = letters[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                return "module", module
            if letter in _VALUED_LETTERS:
                if j == len(letters) - 1:
                    i += 1  # the value is the next word
                break
        i += 1
    return "nothing", ""


def _coverage_runs(args: Sequence[str]) -> bool:
    """``coverage run [options] -m pytest|unittest`` (a test runner under coverage)."""
    words = [w for w in args if not w.startswith("-")]
    if not words or words[0] != "run":
        return False
    rest = list(args[args.index("run") + 1 :])
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in ("-m", "--module"):
            return (rest[i + 1] if i + 1 < len(rest) else "") in TEST_MODULES
        if not word.startswith("-"):
            return False  # a script, not a test runner
        i += 2 if word in _COVERAGE_VALUED else 1
    return False


def _shown(argv: Sequence[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 80 else text[:77] + "..."
