"""Run a verification command: allow-listed, without a shell, and contained.

The contract, in order:

1. the command string is split with :func:`shlex.split` (POSIX rules); the words are passed to
   the program as they are — ``;``, ``|``, ``&&``, ``$(...)`` and backticks are literal text,
   because no shell ever sees them;
2. the program (the first word) must be a **bare name** on the allow-list. A path (``./pytest``,
   ``/usr/bin/pytest``, ``bin/pytest``) is refused even when its last component is allowed: the
   service resolves the name on its own search path, so the caller cannot choose which file runs;
3. the arguments pass the program's policy (:mod:`affidavit.claims.policy`): no inline code
   (``python -c``, ``-m`` outside ``allowed_modules``, pip beyond reading) unless the
   configuration allows it, nothing that rewrites sources in place, and files written only
   in the sandbox's scratch directory;
4. the program runs in a bubblewrap sandbox (:mod:`affidavit.claims.bwrap`: its own user, pid,
   network, IPC and UTS namespaces, only the system, interpreter and project paths visible and
   read-only, a private ``/tmp`` as home and scratch directory), with stdin from ``/dev/null``,
   an environment built from scratch (``PATH``, ``HOME``, ``TMPDIR``, locale, plus the variables
   the configuration names), and with CPU, address-space, file-size, process-count and
   core-dump limits. Without bubblewrap nothing runs (:class:`SandboxUnavailable`) unless the
   configuration says ``isolation="none"`` (the operator's explicit opt-out: then the program
   runs as a plain child process in a new session and a fresh scratch directory);
5. stdout and stderr are read concurrently; each is hashed in full and kept up to a cap (its head
   and its tail), so a flood of output costs memory bounded by the cap;
6. at the timeout the sandbox is killed, and with its init every process of its pid namespace
   (however it forked or ``setsid``); when the program exits, the namespace goes with it.
   Without the sandbox: the process group, and any descendant still in the program's tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from affidavit.claims import cgroups, policy, rlimits
from affidavit.claims.bwrap import Jail, jail_for, require_bwrap, why_not_started
from affidavit.claims.capture import Capture, Captured
from affidavit.claims.launch import jailed_exit_code, plan_launch
from affidavit.claims.policy import DEFAULT_ALLOWED_MODULES
from affidavit.core.errors import CommandNotAllowed, ConfigError

DEFAULT_ALLOWED_PROGRAMS = frozenset(
    {
        # development tools
        "pytest",
        "python",
        "python3",
        "coverage",
        "ruff",
        "mypy",
        "black",
        "isort",
        "flake8",
        "bandit",
        "safety",
        "pip",
        # plain utilities
        "echo",
        "cat",
        "ls",
        "pwd",
        "whoami",
        "true",
        "false",
        "sleep",
    }
)
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream
DEFAULT_EXCERPT_BYTES = 4096  # bytes of each stream stored in the evidence record
DEFAULT_MEMORY_BYTES = 2 << 30  # address space
DEFAULT_FILE_SIZE_BYTES = 256 << 20
DEFAULT_SCRATCH_BYTES = 256 << 20  # the sandbox's private /tmp
DEFAULT_MAX_PROCESSES = 256
DEFAULT_CLAIM_MEMORY_BYTES = 1 << 30  # all of a claim's processes and its /tmp, in a cgroup
ISOLATIONS = ("bwrap", "none")
# After a kill, how long to keep reading for output still buffered in the pipes. A descendant
# that left the process group could hold them open forever; it does not hold up the result.
_DRAIN_AFTER_KILL_S = 1.0
_READ_CHUNK = 1 << 16


def default_search_path() -> str:
    """The directory of the running interpreter (so that the tools installed next to affidavit
    are found), then the system directories."""
    return os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How verification commands are checked and run. Every field has a safe default."""

    allowed_programs: frozenset[str] = DEFAULT_ALLOWED_PROGRAMS
    allow_inline_code: bool = False
    allowed_modules: frozenset[str] = DEFAULT_ALLOWED_MODULES  # for `python -m`, `coverage run -m`
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_bytes: int = DEFAULT_OUTPUT_CAP
    excerpt_bytes: int = DEFAULT_EXCERPT_BYTES
    memory_bytes: int | None = DEFAULT_MEMORY_BYTES
    cpu_seconds: int | None = None  # None: the timeout rounded up, plus one second
    file_size_bytes: int | None = DEFAULT_FILE_SIZE_BYTES
    project_dir: str | None = None  # None: a fresh scratch directory per run
    search_path: str | None = None  # None: default_search_path()
    pass_env: tuple[str, ...] = ()  # names of variables copied from the service's environment
    # "bwrap": the bubblewrap sandbox (required); "none": the operator's explicit opt-out
    isolation: str = "bwrap"
    max_processes: int | None = DEFAULT_MAX_PROCESSES  # per claim too, in a cgroup
    claim_memory_bytes: int = DEFAULT_CLAIM_MEMORY_BYTES
    cgroup_limits: bool = True  # False: per-process rlimits only, even where a cgroup is free
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES
    # Never visible to a command (the signing key, the database, the data directory): a
    # sandbox that would bind one of them refuses to run.
    protected_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ConfigError(
                f"unknown isolation {self.isolation!r}", hint=f"One of: {', '.join(ISOLATIONS)}."
            )
        for name in self.allowed_programs:
            if not name or "/" in name or name != name.strip():
                raise ConfigError(f"allowed program {name!r} must be a bare program name")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ConfigError(f"timeout must be a positive number of seconds, not {self.timeout_s}")
        if self.max_output_bytes < 2 or self.excerpt_bytes < 2:
            raise ConfigError("output caps must be at least 2 bytes")
        if self.project_dir is not None and not os.path.isdir(self.project_dir):
            raise ConfigError(f"project directory {self.project_dir!r} does not exist")


@dataclass(frozen=True, slots=True)
class Command:
    """A command that passed the allow-list: its text and its words."""

    text: str
    argv: tuple[str, ...]

    @property
    def program(self) -> str:
        return self.argv[0]


def parse_command(text: str, config: SandboxConfig) -> Command:
    """Split ``text`` and check it against the allow-list (steps 1–3 of the module contract).

    Raises:
        CommandNotAllowed: empty or unparsable, a path as the program, a program not on the
            allow-list, or an inline-code form that the configuration does not allow.
    """
    if not isinstance(text, str) or not text.strip():
        raise CommandNotAllowed("the verification command is empty")
    if "\x00" in text:
        raise CommandNotAllowed("the verification command contains a NUL character")
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CommandNotAllowed(f"cannot split the command {text!r}: {exc}") from None
    if not argv:
        raise CommandNotAllowed("the verification command is empty")
    program = argv[0]
    if "/" in program:
        raise CommandNotAllowed(
            f"program {program!r} is a path; only bare program names are accepted",
            hint="Name the program without a directory (e.g. `pytest`): the service looks it "
            "up on its own search path, so the caller cannot choose which file runs.",
        )
    if program not in config.allowed_programs:
        allowed = ", ".join(sorted(config.allowed_programs))
        raise CommandNotAllowed(
            f"program {program!r} is not on the allow-list",
            hint=f"Allowed programs: {allowed}. Commands run without a shell.",
        )
    refusal = policy.check(
        argv,
        policy.Context(
            allow_inline_code=config.allow_inline_code,
            allowed_modules=config.allowed_modules,
            sandboxed=config.isolation == "bwrap",
            project=config.project_dir,
        ),
    )
    if refusal is not None:
        hint = (
            "Run a file from the project (e.g. `python check.py`) or an allowed module instead, "
            "or enable inline code in the service configuration."
            if refusal.inline
            else "A claim checks the project, it never changes it: write files only under "
            "/tmp/ (the sandbox's scratch directory); see docs/claims.md, argument policies."
        )
        raise CommandNotAllowed(refusal.message(), hint=hint)
    return Command(text=text, argv=tuple(argv))


# --- running ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunResult:
    """What running a command produced. ``return_code`` is ``-N`` when signal N ended it and
    ``None`` when it timed out or could not start."""

    command: Command
    return_code: int | None
    duration_ms: float
    timed_out: bool
    spawn_error: str | None
    stdout: Captured
    stderr: Captured
    workdir: str  # "scratch" or "project"
    limits: Mapping[str, Any] = field(default_factory=dict)


_EMPTY = Capture(2).result()


def _rlimits(config: SandboxConfig, timeout_s: float) -> list[tuple[int, int]]:
    cpu = config.cpu_seconds if config.cpu_seconds is not None else math.ceil(timeout_s) + 1
    return rlimits.wanted(cpu, config.memory_bytes, config.file_size_bytes, config.max_processes)


def build_env(config: SandboxConfig, home: str) -> dict[str, str]:
    """The child's whole environment: nothing of the service's leaks unless named in
    ``pass_env``."""
    env = {
        "PATH": config.search_path or default_search_path(),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "NO_COLOR": "1",
        # Tools keep their caches and data files in the scratch directory, not the project
        # (read-only in the sandbox).
        "MYPY_CACHE_DIR": os.path.join(home, ".mypy_cache"),
        "RUFF_CACHE_DIR": os.path.join(home, ".ruff_cache"),
        "PYTEST_ADDOPTS": "-p no:cacheprovider",
    }
    for name in config.pass_env:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """Live descendants of ``root`` by parent links in ``/proc`` (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _kill_tree(pid: int) -> None:
    """At a timeout: the process group, and any descendant that left it (``setsid``) while
    still attached to the tree. Descendants are found before the group dies, because once the
    program is dead its orphans are re-parented and can no longer be told apart."""
    strays = _descendants(pid)
    _kill_group(pid)
    for stray in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(stray, signal.SIGKILL)


def run_command(
    command: Command, config: SandboxConfig, *, timeout_s: float | None = None
) -> RunResult:
    """Run an allow-listed ``command`` (steps 4–6 of the module contract). Never raises for
    what the command does: a program that cannot start is reported in ``spawn_error``, a
    timeout in ``timed_out``.

    Raises:
        SandboxUnavailable: bubblewrap is required and missing, or the sandbox would show a
            protected path (nothing ran).
        ConfigError: a timeout that is not a positive number.
    """
    timeout = config.timeout_s if timeout_s is None else timeout_s
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"timeout must be a positive number of seconds, not {timeout}")
    limits = _rlimits(config, timeout)
    limit_doc: dict[str, Any] = {rlimits.resource_name(res): value for res, value in limits}
    workdir = "project" if config.project_dir else "scratch"
    where: tuple[str, Jail] | str
    if config.isolation == "bwrap":
        search = config.search_path or default_search_path()
        jail = jail_for(search, config.project_dir, config.scratch_bytes)
        jail.check(config.protected_paths)
        where = (require_bwrap(), jail)
    else:
        where = tempfile.mkdtemp(prefix="affidavit-claim-")
    leaf, limit_doc["cgroup"] = _claim_leaf(config)
    try:
        result = _run(command, config, timeout, limits, limit_doc, workdir, where, leaf)
    finally:
        if isinstance(where, str):
            shutil.rmtree(where, ignore_errors=True)
        if leaf is not None:
            limit_doc["cgroup"] = {**limit_doc["cgroup"], **leaf.report()}
            leaf.remove()
    return dataclasses.replace(result, limits=limit_doc)


def _claim_leaf(config: SandboxConfig) -> tuple[cgroups.Leaf | None, dict[str, Any]]:
    """The claim's cgroup leaf and what the evidence says about it (``version: none`` and
    why, when only the per-process limits bound the claim)."""
    if not config.cgroup_limits:
        return None, {"version": "none", "reason": "cgroup limits are turned off"}
    where = cgroups.support()
    if not where.kind:
        return None, {"version": "none", "reason": where.reason}
    pids = config.max_processes or DEFAULT_MAX_PROCESSES
    try:
        leaf = cgroups.Leaf.create(where, config.claim_memory_bytes, pids)
    except OSError as exc:
        return None, {"version": "none", "reason": f"cannot make the claim's cgroup: {exc}"}
    return leaf, {"memory_bytes": config.claim_memory_bytes, "pids": pids}


def _run(
    command: Command,
    config: SandboxConfig,
    timeout: float,
    limits: list[tuple[int, int]],
    limit_doc: dict[str, Any],
    workdir: str,
    where: tuple[str, Jail] | str,
    leaf: cgroups.Leaf | None,
) -> RunResult:
    """Spawn in the jail (``(bwrap, jail)``) or, unsandboxed, in the scratch directory."""
    sandboxed = not isinstance(where, str)
    home = "/tmp" if sandboxed else str(where)
    env = build_env(config, home)
    started = time.perf_counter()

    def failed(reason: str) -> RunResult:
        elapsed = (time.perf_counter() - started) * 1000
        return RunResult(command, None, elapsed, False, reason, _EMPTY, _EMPTY, workdir, limit_doc)

    executable = shutil.which(command.program, path=env["PATH"])
    if executable is None:
        return failed(f"program {command.program!r} was not found on the search path")
    launch = plan_launch(executable, list(command.argv[1:]), env, limits, where, config.project_dir)
    try:
        proc = subprocess.Popen(
            launch.argv,
            executable=launch.argv[0],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=launch.cwd,
            env=launch.env,
            close_fds=True,
            pass_fds=launch.pass_fds,
            start_new_session=True,
            preexec_fn=_in_child(leaf, None if launch.prefixed else rlimits.limit_setter(limits)),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        if sandboxed:
            os.close(launch.status_r)
            os.close(launch.status_w)
        return failed(f"cannot start {command.program!r}: {exc}")
    if sandboxed:
        os.close(launch.status_w)
    out, err = Capture(config.max_output_bytes), Capture(config.max_output_bytes)
    try:
        timed_out = _await_exit(proc, out, err, started + timeout)
    finally:
        return_code: int | None = proc.wait()
        status = _read_status(launch.status_r) if sandboxed else None
    elapsed = (time.perf_counter() - started) * 1000
    stderr = err.result()
    if not isinstance(where, str) and not timed_out:
        code = jailed_exit_code(status)
        if code is None:
            # bubblewrap could not set up the sandbox or exec the program: it says why.
            reason = " ".join(stderr.segments()).strip() or f"bwrap exited {return_code}"
            reason = reason[:500] + why_not_started(executable, where[1])
            return failed(f"cannot start {command.program!r} in the sandbox: {reason}")
        return_code = code
    return RunResult(
        command,
        None if timed_out else return_code,
        elapsed,
        timed_out,
        None,
        out.result(),
        stderr,
        workdir,
        limit_doc,
    )


def _await_exit(proc: subprocess.Popen[bytes], out: Capture, err: Capture, deadline: float) -> bool:
    """Capture the output until the command exits or ``deadline`` passes (then kill its tree);
    in any case kill what is left of its process group. True: it timed out."""
    assert proc.stdout is not None and proc.stderr is not None
    timed_out = False
    try:
        timed_out = _pump(proc, {proc.stdout: out, proc.stderr: err}, deadline)
        if not timed_out:  # without a pidfd the exit may still be ahead
            try:
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(proc.pid)
    finally:
        _kill_group(proc.pid)  # at a timeout everything; otherwise what was left running
    return timed_out


def _in_child(
    leaf: cgroups.Leaf | None, setter: Callable[[], None] | None
) -> Callable[[], None] | None:
    """What runs between fork and exec: join the claim's cgroup, set the limits."""
    join = leaf.join if leaf is not None else None
    if join is None or setter is None:
        return join or setter

    def both() -> None:
        join()
        setter()

    return both


def _read_status(fd: int) -> dict[str, Any] | None:
    """The last JSON document bubblewrap wrote on its status pipe (its writers are gone)."""
    chunks = []
    os.set_blocking(fd, False)  # what bubblewrap wrote before it exited is in the pipe
    try:
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    found: dict[str, Any] | None = None
    decoder = json.JSONDecoder()
    text, at = b"".join(chunks).decode("utf-8", "replace"), 0
    while True:
        at = len(text) - len(text[at:].lstrip())
        if at >= len(text):
            return found
        try:
            doc, at = decoder.raw_decode(text, at)
        except ValueError:
            return found
        if isinstance(doc, dict) and "exit-code" in doc:
            found = doc


def _pump(
    proc: subprocess.Popen[bytes], streams: dict[IO[bytes], Capture], deadline: float
) -> bool:
    """Read both pipes until they close. When the program exits, kill what it left running in
    its process group; at ``deadline``, kill the whole group. After either, keep reading only
    briefly (a descendant that left the group may hold the pipes open). Return whether the
    deadline was hit."""
    sel = selectors.DefaultSelector()
    captures: dict[int, Capture] = {}
    for stream, capture in streams.items():
        fd = stream.fileno()
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
        captures[fd] = capture
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    exited = timed_out = False
    until = deadline  # the deadline, then the end of the drain after a kill

    def ended(now: float, *, timeout: bool = False) -> float:
        # Before the program is reaped, its pid (the group id) cannot be reused.
        (_kill_tree if timeout else _kill_group)(proc.pid)
        return now + _DRAIN_AFTER_KILL_S

    try:
        # With a pidfd, also wait (without polling) for the exit after the pipes closed.
        while captures or (pidfd is not None and not exited):
            now = time.perf_counter()
            if now >= until:
                if exited:
                    break
                exited = timed_out = True
                until = ended(now, timeout=True)
            wait = until - now
            if pidfd is None and not exited:
                wait = min(wait, 0.05)  # no pidfd: notice the exit by polling
            if not captures and exited:
                break
            for key, _ in sel.select(wait):
                fd = int(key.fd)
                if fd == pidfd:
                    sel.unregister(fd)
                    if not exited:
                        exited = True
                        until = ended(time.perf_counter())
                    continue
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    captures[fd].feed(chunk)
                else:
                    sel.unregister(fd)
                    del captures[fd]
            if pidfd is None and not exited and proc.poll() is not None:
                exited = True
                until = ended(time.perf_counter())
    finally:
        sel.close()
        for stream in streams:
            stream.close()
        if pidfd is not None:
            os.close(pidfd)
    return timed_out


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None
