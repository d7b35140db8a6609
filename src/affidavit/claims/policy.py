"""Argument policies: exactly which options, values and arguments each allowed program may be
given.

A program name on the allow-list is not enough: ``python -m timeit -s CODE`` runs code,
``coverage erase --data-file=FILE`` deletes a file, ``pytest --junitxml=FILE`` overwrites one,
``ruff check --fix`` rewrites sources. So each allowed program has a table
(:mod:`affidavit.claims.programs`) of what a claim may give it, and everything else is refused
(:mod:`affidavit.claims.argspec` walks the words):

1. code given on the command line or fetched at run time is refused unless the configuration
   allows inline code: ``python -c``, ``-m`` of a module outside ``allowed_modules`` (the same
   for ``coverage run -m``), a script that is not the project's (``python .../timeit.py``,
   ``python .../pdb.py``: the interpreter's own library), pip's commands that install or
   change the environment;
2. options that rewrite the checked sources in place are not in the tables (``ruff check
   --fix``, ``ruff format`` without ``--check``/``--diff``, ``black``/``isort`` without a check
   option, ``coverage combine`` without ``--keep``, ``mypy --install-types``...);
3. every option value is checked for its shape: a path the tool writes must be inside the
   sandbox's private scratch directory (``/tmp/...``), a path it reads inside the project, a
   count an integer, a choice a name from its set; ``pytest -o addopts=...`` is checked as
   pytest's own options; a configuration given inline (``ruff --config 'fix = true'``) is not
   a file of the project and is refused. Without the sandbox (``isolation="none"``) there is
   no private scratch directory, and every option that writes a file is refused;
4. options are matched by their full names only: an abbreviation (``--data-f=FILE``, which
   argparse would expand to ``--data-file``) is refused, not guessed at.

Programs without a table (``echo``, ``cat``, ``ls``...) take any arguments: they run code of
no one's choosing. A module the operator adds to ``allowed_modules`` without a table takes any
arguments too (the operator's choice).

The result is a :class:`Refusal` naming the argument, or ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

from affidavit.claims.argspec import SCRATCH, Context, Refusal, in_scratch, walk
from affidavit.claims.programs import PROGRAMS, module_policy

__all__ = [
    "DEFAULT_ALLOWED_MODULES",
    "PIP_READ_ONLY",
    "SCRATCH",
    "Context",
    "Refusal",
    "check",
    "in_scratch",
    "module_policy",
]

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
PIP_READ_ONLY = frozenset(PROGRAMS["pip"].subcommands)


def check(argv: Sequence[str], ctx: Context) -> Refusal | None:
    """The first refused argument of ``argv`` (whose program is allow-listed), or ``None``."""
    spec = PROGRAMS.get(_base(argv[0]))
    return walk(spec, argv[0], list(argv[1:]), ctx) if spec is not None else None


def _base(program: str) -> str:
    if program.startswith("python"):
        return "python"
    if program.startswith("pip"):
        return "pip"
    return program
