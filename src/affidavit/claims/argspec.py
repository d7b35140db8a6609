"""The argument-policy engine: a program's allowed words as data, and the walk that checks them.

A :class:`Spec` says exactly what one program (or one of its subcommands) may be given:

- ``options``: each allowed option and what follows it — ``None`` for a flag, a *shape* (a
  function that checks the value: an int, a name from a set, a path inside the project, a path
  in the scratch directory...), or a :class:`Tail` (``python -m MODULE``: the rest of the words
  belong to the module, and the module's own spec checks them);
- ``positional``: the shape of every positional argument (``None``: none allowed), or a
  :class:`Tail` (``python SCRIPT ARGS``: the script's arguments are the script's own);
- ``subcommands``: the first positional names one, whose spec checks the rest.

Everything else is refused: an option not in the table (including an abbreviation of one — the
tables list full names only, so a prefix that the tool's parser would expand is never read as
a harmless flag), a flag given a value, a value of the wrong shape. Short options cluster as
the tools' parsers read them (``-am timeit`` is ``-a -m timeit``).
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from affidavit.claims.paths import module_dir_of

SCRATCH = "/tmp"
MAX_WORD = 4096  # no legitimate option value or path is longer


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
    """What a policy needs from the configuration: ``project`` is the directory commands run
    in (``None``: the fresh scratch directory)."""

    allow_inline_code: bool
    allowed_modules: frozenset[str]
    sandboxed: bool
    project: str | None = None


# A shape checks one value: ``None`` if it fits, else what is wrong (a phrase).
Shape = Callable[[str, Context], str | None]


@dataclass(frozen=True, slots=True)
class Tail:
    """An option or positional after which the remaining words belong to something else:
    ``check(prog, word, value, rest, ctx)`` decides about all of them."""

    check: Callable[[str, str, str, list[str], Context], Refusal | None]


@dataclass(frozen=True, slots=True)
class MaybeValue:
    """An option whose value may be left out (argparse's ``nargs="?"``): bare when the next
    word is an option or there is none; ``shape`` then checks ``""``."""

    shape: Shape


Value = Shape | Tail | MaybeValue | None


@dataclass(frozen=True, slots=True)
class Spec:
    """What one program (or subcommand) may be given. ``required``: at least one of these
    options must be present, else ``required_reason`` refuses; ``refused``: options known to
    be harmful, with the reason (a clearer message than "not allowed")."""

    options: Mapping[str, Value] = field(default_factory=dict)
    positional: Shape | Tail | None = None
    subcommands: Mapping[str, Spec] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    required_reason: str = ""
    other_subcommand: str = "is not a subcommand a claim may run"
    other_subcommand_inline: bool = False
    # Without the sandbox the working directory is the project: a command that writes a file
    # there by default (a coverage data file, a report) is refused, with this reason.
    writes_by_default: str = ""


def walk(spec: Spec, prog: str, args: Sequence[str], ctx: Context) -> Refusal | None:
    """The first refused word of ``args`` under ``spec``, or ``None``."""
    if spec.writes_by_default and not ctx.sandboxed:
        return Refusal(prog.rsplit(" ", 1)[-1], f"`{prog}` {spec.writes_by_default}")
    seen: set[str] = set()
    deferred: Refusal | None = None  # a bad option value before the subcommand is decided
    only_positional = False
    i = 0
    while i < len(args):
        word = args[i]
        if len(word) > MAX_WORD:
            return Refusal(word[:40] + "...", f"is longer than {MAX_WORD} characters")
        if not only_positional and word == "--":
            only_positional = True
            i += 1
            continue
        if not only_positional and word.startswith("-") and word != "-":
            step = _option(spec, prog, args, i, ctx, seen)
            if step.refusal is not None:
                if not (spec.subcommands and step.deferrable):
                    return step.refusal
                deferred = deferred or step.refusal
            if step.done:
                return deferred  # a tail decided the rest
            i = step.next
            continue
        if spec.subcommands:
            sub = spec.subcommands.get(word)
            if sub is None:
                return Refusal(
                    word, f"`{prog} {word}` {spec.other_subcommand}", spec.other_subcommand_inline
                )
            return deferred or walk(sub, f"{prog} {word}", args[i + 1 :], ctx)
        if isinstance(spec.positional, Tail):
            return spec.positional.check(prog, word, word, list(args[i + 1 :]), ctx)
        if spec.positional is None:
            return Refusal(word, f"`{prog}` takes no positional argument from a claim")
        problem = spec.positional(word, ctx)
        if problem is not None:
            return Refusal(word, f"`{prog}`: {problem}")
        i += 1
    if deferred is not None:
        return deferred
    if spec.required and not seen & spec.required:
        return Refusal(prog.rsplit(" ", 1)[-1], f"`{prog}` {spec.required_reason}")
    return None


@dataclass(frozen=True, slots=True)
class _Step:
    """The outcome of one option word: the index of the next word, a refusal (``deferrable``:
    a bad value, reported only if the subcommand is allowed), or ``done`` (a tail decided)."""

    next: int
    refusal: Refusal | None = None
    deferrable: bool = False
    done: bool = False


def _option(
    spec: Spec, prog: str, args: Sequence[str], i: int, ctx: Context, seen: set[str]
) -> _Step:
    """Check the option word ``args[i]`` (with its value)."""
    word = args[i]
    if word.startswith("--"):
        name, eq, value = word.partition("=")
        return _one(spec, prog, args, i, ctx, seen, name, value if eq else None)
    at = 1
    while at < len(word):
        name = "-" + word[at]
        if name not in spec.refused and name in spec.options and spec.options[name] is None:
            seen.add(name)  # a flag: the next letter is another option
            at += 1
            continue
        return _one(spec, prog, args, i, ctx, seen, name, word[at + 1 :] or None)
    return _Step(i + 1)


def _one(
    spec: Spec,
    prog: str,
    args: Sequence[str],
    i: int,
    ctx: Context,
    seen: set[str],
    name: str,
    value: str | None,
) -> _Step:
    word = args[i]
    if name in spec.refused:
        return _Step(i + 1, Refusal(word, f"`{prog} {name}` {spec.refused[name]}"))
    if name not in spec.options:
        reason = f"`{name}` is not an option a claim may give `{prog}` (docs/claims.md)"
        return _Step(i + 1, Refusal(word, reason))
    kind = spec.options[name]
    seen.add(name)
    if kind is None:
        if value is not None:
            return _Step(i + 1, Refusal(word, f"`{prog} {name}` takes no value"))
        return _Step(i + 1)
    shown = word
    if isinstance(kind, MaybeValue):
        if value is None and (i + 1 >= len(args) or args[i + 1].startswith("-")):
            value = ""
        kind = kind.shape
    if value is None:
        if i + 1 >= len(args):
            return _Step(i + 1, Refusal(word, f"`{prog} {name}` needs a value"))
        i += 1
        value = args[i]
        shown = f"{word} {value}"
    if isinstance(kind, Tail):
        return _Step(len(args), kind.check(prog, name, value, list(args[i + 1 :]), ctx), done=True)
    problem = kind(value, ctx)
    if problem is not None:
        return _Step(i + 1, Refusal(shown, f"`{prog} {name}` {problem}"), deferrable=True)
    return _Step(i + 1)


# --- shapes ---------------------------------------------------------------------------------


def in_scratch(path: str) -> bool:
    """``path`` is an absolute path inside the sandbox's private scratch directory."""
    return os.path.isabs(path) and os.path.normpath(path).startswith(SCRATCH + "/")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def project_path(value: str, ctx: Context) -> str | None:
    """A path the command reads: inside the project (or, in the sandbox, the scratch
    directory), resolved through symlinks, and not in the interpreter's own library."""
    if not value or value.startswith("@"):
        return f"reads {value!r}, which is not a path inside the project"
    if os.path.isabs(value):
        if ctx.sandboxed and in_scratch(value):
            found = module_dir_of(os.path.normpath(value), ctx.project)
            return None if found is None else _module_problem(value, found)
        if ctx.project is None or not _inside(os.path.realpath(value), _real(ctx.project)):
            return f"reads {value!r}, outside the project"
    elif ctx.project is None:
        if os.path.normpath(value).startswith(".."):
            return f"reads {value!r}, outside the working directory"
        return None
    resolved = os.path.realpath(os.path.join(ctx.project, value))
    if not _inside(resolved, _real(ctx.project)):
        return f"reads {value!r}, which resolves outside the project"
    found = module_dir_of(resolved, ctx.project)
    return None if found is None else _module_problem(value, found)


def project_file(value: str, ctx: Context) -> str | None:
    """An existing file of the project (a configuration file): a value that is no file is
    refused, however the tool would read it (``ruff --config 'fix = true'`` is inline TOML)."""
    problem = project_path(value, ctx)
    if problem is not None:
        return problem
    if ctx.project is None or not os.path.isfile(os.path.join(ctx.project, value)):
        return f"takes a configuration file of the project, and {value!r} is none"
    return None


def _module_problem(value: str, found: str) -> str:
    return f"names {value!r}, a file of the interpreter's own library ({found}), not of the project"


def _real(path: str) -> str:
    return os.path.realpath(path)


def scratch_path(value: str, ctx: Context) -> str | None:
    """A path the command writes: inside the sandbox's private scratch directory."""
    if not ctx.sandboxed:
        return (
            "writes a file, and without the sandbox there is no private scratch directory "
            "to write it to"
        )
    if not in_scratch(value):
        return (
            f"writes {value!r}, outside the sandbox's scratch directory (give a path under /tmp/)"
        )
    return None


def node_id(value: str, ctx: Context) -> str | None:
    """A test node id: ``path[::name...]`` with the path inside the project."""
    path, _, _name = value.partition("::")
    return project_path(path, ctx)


def integer(value: str, ctx: Context) -> str | None:
    return None if re.fullmatch(r"[0-9]{1,9}", value) else f"takes a whole number, not {value!r}"


def number(value: str, ctx: Context) -> str | None:
    ok = re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,6})?", value)
    return None if ok else f"takes a number, not {value!r}"


def names(*allowed: str) -> Shape:
    """One of ``allowed``."""
    options = frozenset(allowed)

    def shape(value: str, ctx: Context) -> str | None:
        if value in options:
            return None
        return f"takes one of {', '.join(sorted(options))}, not {value!r}"

    return shape


def pattern(regex: str, what: str) -> Shape:
    """A value matching ``regex`` in full (``what`` says what it is, for the message)."""
    compiled = re.compile(regex)

    def shape(value: str, ctx: Context) -> str | None:
        return None if compiled.fullmatch(value) else f"takes {what}, not {value!r}"

    return shape


def either(*shapes: Shape) -> Shape:
    """A value any of ``shapes`` accepts (the first one's complaint otherwise)."""

    def shape(value: str, ctx: Context) -> str | None:
        problems = [s(value, ctx) for s in shapes]
        return None if None in problems else problems[0]

    return shape


# Text a tool only matches or prints (a keyword expression, a glob, a rule code): one line,
# no NUL, bounded by MAX_WORD.
TEXT = pattern(r"[^\x00-\x1f]*", "one line of text")
IDENT = pattern(r"[A-Za-z_][A-Za-z0-9_.\-]*", "a name")
CODES = pattern(r"[A-Za-z0-9_,]*", "rule codes separated by commas")
GLOBS = pattern(r"[A-Za-z0-9_.*?/\-,\[\]!]*", "file patterns")
_WARNING_NAMES = sorted(
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Warning)
)
# ``action[:message[:category[:module[:lineno]]]]``: a category outside the built-in warnings
# would be imported (running its module), so only built-in categories are accepted.
WARNING_FILTER = pattern(
    r"(default|error|ignore|always|module|once)(:[^:\x00-\x1f]*"
    rf"(:({'|'.join(_WARNING_NAMES)})?(:[A-Za-z0-9_.]*(:[0-9]*)?)?)?)?",
    "a warning filter of a built-in warning category",
)


def flags(words: str) -> dict[str, Value]:
    """``{"-q": None, "--verbose": None, ...}`` from a space-separated list of flags."""
    return dict.fromkeys(words.split())


def valued(shape: Shape, words: str) -> dict[str, Value]:
    """Options that each take a value of ``shape``."""
    return dict.fromkeys(words.split(), shape)
