"""The tool SDK (docs/formats.md §8): decorators that register tools, and the context they receive.

``@tool`` marks a function that may change the world: every call goes through the invocation
ledger, so a committed call is never made again. ``@pure`` marks one without side effects (an
LLM call, a computation): its output is recorded once and injected on replay.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError, CanonicalizationError, ConfigError, StreamError

if TYPE_CHECKING:
    from affidavit.runtime._agent import Agent
    from affidavit.runtime._confirm import ResourceVerifier
    from affidavit.runtime._limits import Limit
    from affidavit.runtime._stream import StepStream


class RetryableError(Exception):
    """Raise from a tool to ask for a retry (under the retry policy). Any other exception is a
    permanent failure unless the tool lists its type in ``retry_on``."""


class CompensatableError(Exception):
    """Raise from a tool that acted partially: the runtime runs its compensation, records
    ``step_compensated``, and fails the job."""


class ToolCallError(TypeError):
    """A tool, pure function, reconcile hook or compensation cannot take the step's context
    and arguments (``fn(ctx, **args)``): a parameter missing, one too many, or no parameter for
    the context. Never retried, whatever ``retry_on`` says: the call fails before the function
    runs, and would fail the same way again."""


class ToolError(AffidavitError):
    code = "tool_error"
    default_hint = "Check the tool's registration and the values it returns."


class ToolCancelled(AffidavitError):
    """Raised by :meth:`ToolContext.check_cancelled` in a tool whose job was asked to cancel
    (``affidavit cancel``). A tool that lets it out stops of its own decision: the call is
    recorded as the failure it is (never retried) and the job then ends cancelled."""

    code = "tool_cancelled"
    default_hint = "The job was asked to cancel; the tool stopped before it finished."


@dataclass(frozen=True, slots=True)
class StateChange:
    resource_type: str
    resource_id: str
    operation: str
    version: str | int | None = None
    etag: str | None = None
    external_ref: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateChange:
        """The change as recorded in a ``state_changed`` event."""
        return cls(
            str(data["resource_type"]),
            str(data["resource_id"]),
            str(data["operation"]),
            data.get("version"),
            data.get("etag"),
            data.get("external_ref"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "resource_type": self.resource_type,
            "resource_id": self.resource_id,
            "operation": self.operation,
        }
        for name in ("version", "etag", "external_ref"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass
class ToolContext:
    """What a tool receives as its first argument.

    ``idempotency_key`` is the ledger's internal key; ``external_key``
    (``affidavit:<job>:<step>:<attempt>``) is the one to pass to downstream APIs that deduplicate
    (payments, e-mail, webhooks): within one claim of the job a retry reuses it.
    """

    job_id: str
    node_id: str
    step_id: str
    attempt: int
    idempotency_key: str | None
    external_key: str
    state_changes: list[StateChange] = field(default_factory=list)
    # what the step spent (report_usage): recorded in its node_finished, counted by budgets
    usage: dict[str, int | float] = field(default_factory=dict)
    # Why nothing can be recorded any more (the step is over, or a pure step); None while open.
    _closed: str | None = field(default=None, init=False, repr=False, compare=False)
    # the job's stream while the step's function runs (set by the step executor)
    stream: StepStream | None = field(default=None, repr=False, compare=False)

    def emit(self, value: Any) -> None:
        """Append ``value`` (JSON, at most 64 KiB as canonical JSON) to the job's live stream
        at once, naming this step and attempt (a ``stream_emitted`` event): readers see it
        while the step runs. A completed step never runs again, so it never emits again; a
        step that runs again (a retry, a pure step cut off by a crash) emits as it runs.

        Raises:
            StreamError: the value is not JSON, over 64 KiB or over the job's stream limit,
                or the step is over; nothing is recorded.
        """
        if self.stream is None:
            raise StreamError(f"ctx.emit: step {self.node_id!r} has no stream here")
        self.stream.emit(value)

    # set once the run learns that the job was asked to cancel (its lease's heartbeat polls
    # the store's cancel request): what :attr:`cancelled` reads, without a query
    cancel_asked: threading.Event | None = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """Whether the job was asked to cancel (``affidavit cancel``) while this call runs —
        learnt from the run's heartbeat, so up to a heartbeat interval late. A long-running
        tool may look at it between units of work and stop (see :meth:`check_cancelled`)."""
        return self.cancel_asked is not None and self.cancel_asked.is_set()

    def check_cancelled(self) -> None:
        """Stop here if the job was asked to cancel.

        Raises:
            ToolCancelled: :attr:`cancelled` is true. Let it out of the tool: the call is
                recorded as failed with it (the tool's own decision, never retried) and the
                job ends cancelled.
        """
        if self.cancelled:
            raise ToolCancelled(
                f"step {self.node_id!r} stopped: job {self.job_id} was asked to cancel"
            )

    def close(self, reason: str) -> None:
        """End recording: a later :meth:`record_state_change` raises ``ToolError(reason)``
        instead of adding a change nobody will write (the step's events are committed)."""
        self._closed = reason

    def report_usage(self, *, tokens: int = 0, cost: float = 0.0) -> None:
        """Report what this call spent — model tokens, and cost in the unit the job's budget
        uses — added to what the job spent (``affidavit.Budget``) once the step is recorded.

        Raises:
            ToolError: a negative, non-finite or non-numeric amount.
        """
        if type(tokens) is not int or not 0 <= tokens <= 10**12:
            raise ToolError(f"report_usage: tokens must be an integer ≥ 0, not {tokens!r}")
        if type(cost) not in (int, float) or not 0 <= cost <= 10**12:  # (NaN fails too)
            raise ToolError(f"report_usage: cost must be a number ≥ 0, not {cost!r}")
        if tokens:
            self.usage["tokens"] = int(self.usage.get("tokens", 0)) + tokens
        if cost:
            self.usage["cost"] = float(self.usage.get("cost", 0.0)) + float(cost)

    def record_state_change(
        self,
        resource_type: str,
        resource_id: str,
        operation: str,
        version: str | int | None = None,
        etag: str | None = None,
        external_ref: str | None = None,
    ) -> None:
        """Record which outside resource this step changed (recorded as ``state_changed``).

        Raises:
            ToolError: a value that cannot be recorded (the step fails naming it), or a call
                after the step is over (from a thread the tool left running) or in a pure step.
        """
        if self._closed is not None:
            raise ToolError(
                f"record_state_change: {self._closed}",
                hint="Record state changes in a @tool, before it returns.",
            )
        named = {"resource_type": resource_type, "resource_id": resource_id, "operation": operation}
        for name, value in (*named.items(), ("etag", etag), ("external_ref", external_ref)):
            if not isinstance(value, str) and (value is not None or name in named):
                raise ToolError(
                    f"record_state_change: {name} must be a string, not {value!r}",
                    hint="Pass resource ids, operations, etags and references as text.",
                )
        change = StateChange(resource_type, resource_id, operation, version, etag, external_ref)
        try:
            canonical(change.to_dict())
        except CanonicalizationError as exc:
            raise ToolError(f"record_state_change: {exc}", hint=exc.hint) from exc
        self.state_changes.append(change)


ToolFn = Callable[..., Any]


@dataclass
class Tool:
    """A registered tool or pure function. Use the decorators rather than this class."""

    name: str
    fn: ToolFn
    kind: str  # "tool" | "pure"
    version: str = "1"
    retry: int | None = None  # max attempts; None = the plan's policy
    retry_on: tuple[type[BaseException], ...] = ()
    in_flight: str | None = None  # "park" | "fail"; None = the plan's policy
    reconcile_fn: ToolFn | None = None
    compensate_fn: ToolFn | None = None
    # True, or a function of the call's arguments: whether a call needs an approval first
    requires_approval: bool | Callable[..., bool] = False
    approval_policy: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    limit: Limit | None = None  # calls across workers (runtime/_limits.py)
    # a call past its timeout may be made again (the effect is safe to repeat)
    idempotent: bool = False
    timeout_seconds: float | None = None  # per call; a plan node's or ctx.call's comes first

    def needs_approval(self, args: Mapping[str, Any]) -> bool:
        """Whether a call with ``args`` may act only once approved (see
        :func:`~affidavit.runtime._approvals.gate_call`). A predicate that raises, or returns
        anything but a bool, requires approval: the safe answer."""
        rule = self.requires_approval
        if not callable(rule):
            return bool(rule)
        try:
            answer = rule(**args)
        except Exception:
            return True
        return answer is not False

    def __call__(self, ctx: ToolContext, /, **kwargs: Any) -> Any:
        return self.fn(ctx, **kwargs)

    def reconcile(self, fn: ToolFn) -> ToolFn:
        """Register ``fn(ctx, **args) -> result | None``: did the effect with this key
        already happen? Called for an invocation that started but never finished."""
        self.reconcile_fn = fn
        return fn

    def compensate(self, fn: ToolFn) -> ToolFn:
        """Register ``fn(ctx, **args) -> details``: undo a partial effect."""
        self.compensate_fn = fn
        return fn


class ToolRegistry:
    """Name → tool. The module-level :data:`registry` collects decorated functions; a
    :class:`~affidavit.runtime.Runtime` can also be given its own."""

    def __init__(
        self, tools: Iterable[Tool | Agent] = (), verifiers: Iterable[ResourceVerifier] = ()
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._agents: dict[str, Agent] = {}
        self._verifiers: dict[str, list[ResourceVerifier]] = {}
        for t in tools:
            if isinstance(t, Tool):
                self.add(t)
            else:
                self.add_agent(t)
        for v in verifiers:
            self.add_verifier(v)

    def add(self, t: Tool) -> None:
        """Register ``t``. The same tool again is a no-op; another tool under its name — or
        the same function with other settings (version, retries, policy, hooks), which would
        silently decide which version the ledger records — is refused.

        Raises:
            ToolError: the name is taken by a different tool.
        """
        existing = self._tools.get(t.name)
        if existing is not None and existing.fn is not t.fn:
            raise ToolError(
                f"tool {t.name!r} is registered twice",
                hint="Tool names must be unique within a registry.",
            )
        if existing is not None and existing != t:
            raise ToolError(
                f"tool {t.name!r} is registered twice with different settings "
                f"(version {existing.version!r} and {t.version!r})"
                if existing.version != t.version
                else f"tool {t.name!r} is registered twice with different settings",
                hint="Register a function once, with the version, retries, in-flight policy "
                "and hooks it runs with.",
            )
        if existing is None:
            self._tools[t.name] = t

    def add_agent(self, a: Agent) -> None:
        """Register an agent (:func:`affidavit.agent`). The same agent again is a no-op;
        another one under its name is refused.

        Raises:
            ToolError: the name is taken by a different agent.
        """
        existing = self._agents.get(a.name)
        if existing is not None and existing is not a:
            if existing.fn is a.fn and existing.version == a.version:
                return
            raise ToolError(
                f"agent {a.name!r} is registered twice",
                hint="Agent names must be unique within a registry.",
            )
        self._agents[a.name] = a

    def get_agent(self, name: str) -> Agent | None:
        """The agent registered under ``name``."""
        return self._agents.get(name)

    def agent_names(self) -> list[str]:
        return sorted(self._agents)

    def add_verifier(self, verifier: ResourceVerifier) -> None:
        """Register a :class:`~affidavit.runtime._confirm.ResourceVerifier` for the resource
        types it names (confirmation replay asks it about those types)."""
        types = getattr(verifier, "resource_types", None)
        if not types or not callable(getattr(verifier, "verify", None)):
            raise ToolError(
                f"{verifier!r} is not a resource verifier",
                hint="A verifier has `resource_types` (a tuple of names) and "
                "`verify(ctx, change) -> Confirmation`.",
            )
        for resource_type in types:
            listed = self._verifiers.setdefault(resource_type, [])
            if verifier not in listed:
                listed.append(verifier)

    @property
    def verifiers(self) -> dict[str, list[ResourceVerifier]]:
        """Resource type → the verifiers registered for it."""
        return self._verifiers

    def with_verifiers(self, verifiers: Iterable[ResourceVerifier]) -> ToolRegistry:
        """A registry with this one's tools and verifiers plus ``verifiers``."""
        copy = ToolRegistry([*self._tools.values(), *self._agents.values()])
        for listed in self._verifiers.values():
            for v in listed:
                copy.add_verifier(v)
        for v in verifiers:
            copy.add_verifier(v)
        return copy

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)


registry = ToolRegistry()


def _check_options(name: object, version: object, retry: object) -> None:
    """Refuse decorator options the runtime could not use, where the decorator is written."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a tool name must be a non-empty string, not {name!r}")
    if not isinstance(version, str):
        raise ConfigError(f"version of tool {name!r} must be a string, not {version!r}")
    if retry is not None and (type(retry) is not int or retry < 1):
        raise ConfigError(
            f"retry (max attempts) of tool {name!r} must be an integer ≥ 1, not {retry!r}"
        )


def _check_limit(name: str, limit: object) -> None:
    from affidavit.runtime._limits import Limit

    if limit is not None and not isinstance(limit, Limit):
        raise ConfigError(
            f"limit of tool {name!r} must be an affidavit.Limit, not {limit!r}",
            hint='For example limit=affidavit.Limit(rate="50/10s", concurrency=4).',
        )


def check_timeout(what: str, timeout: object) -> None:
    """Refuse a time limit that is not a positive, finite number of seconds (``None``: none)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigError(f"timeout_seconds of {what} must be a number > 0, not {timeout!r}")
    if not 0 < timeout < math.inf:
        raise ConfigError(f"timeout_seconds of {what} must be a number > 0, not {timeout!r}")


def _check_function(name: str, fn: object) -> None:
    if isinstance(fn, Tool):
        raise ToolError(
            f"{fn.name!r} is already registered as a {fn.kind}; it cannot also be {name!r}",
            hint="Decorate a function once; register another function for another name.",
        )
    if not callable(fn):
        raise ToolError(f"tool {name!r}: {fn!r} is not a function")
    if inspect.iscoroutinefunction(fn):
        raise ToolError(
            f"tool {name!r} is an async function; tools are called synchronously",
            hint="Make it a plain function (run the coroutine inside it with asyncio.run).",
        )


def tool(
    name: str,
    *,
    version: str = "1",
    retry: int | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    in_flight: str | None = None,
    requires_approval: bool | Callable[..., bool] = False,
    approvers: list[str] | None = None,
    min_approvals: int | None = None,
    limit: Limit | None = None,
    idempotent: bool = False,
    timeout_seconds: float | None = None,
) -> Callable[[ToolFn], Tool]:
    """Register a tool that may change the world. See the module docstring.

    ``timeout_seconds``: each call's time limit, unless the plan node or ``ctx.call`` gives
    one. A call past it has an unknown outcome: the tool's ``reconcile`` hook resolves it;
    without one it is tried again only when ``idempotent=True`` (the effect is safe to
    repeat), else the job parks for a person (docs/runtime.md, "Timeouts").

    ``requires_approval``: ``True``, or a function called with the call's arguments (as
    keywords) that says whether this call needs approval (``lambda amount, **_: amount >
    100``). Such a call acts only once an approval of exactly that call is recorded in the
    job's log, by a principal ``approvers`` / ``min_approvals`` allow (the defaults: one
    principal of role approver or admin, not the job's submitter); until then the job waits
    for it. A predicate that raises requires approval.

    ``limit``: an :class:`~affidavit.Limit` on the tool's calls across every worker (rate and
    concurrency); a call waits for its slot before it starts."""
    _check_options(name, version, retry)
    _check_limit(name, limit)
    check_timeout(f"tool {name!r}", timeout_seconds)
    if type(idempotent) is not bool:
        raise ConfigError(f"idempotent of tool {name!r} must be True or False, not {idempotent!r}")
    if not (type(requires_approval) is bool or callable(requires_approval)):
        raise ConfigError(
            f"requires_approval of tool {name!r} must be True, False or a function of the "
            f"call's arguments, not {requires_approval!r}"
        )
    try:
        policy = ApprovalPolicy.parse(approvers, min_approvals, f"tool {name!r}")
    except AffidavitError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    if in_flight not in (None, "park", "fail"):
        raise ConfigError(f"in_flight must be 'park' or 'fail', not {in_flight!r}")
    if not isinstance(retry_on, tuple | list) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
    ):
        raise ConfigError(
            f"retry_on of tool {name!r} must be a tuple of exception types, not {retry_on!r}",
            hint="For example retry_on=(TimeoutError, ConnectionError).",
        )

    def register(fn: ToolFn) -> Tool:
        _check_function(name, fn)
        t = Tool(name, fn, "tool", version, retry, tuple(retry_on), in_flight)
        t.requires_approval, t.approval_policy = requires_approval, policy
        t.limit = limit
        t.idempotent, t.timeout_seconds = idempotent, timeout_seconds
        registry.add(t)
        return t

    return register


def pure(
    name: str, *, version: str = "1", retry: int | None = None, limit: Limit | None = None
) -> Callable[[ToolFn], Tool]:
    """Register a function without side effects; its output is recorded and never recomputed
    once the step finished. ``limit``: as for :func:`tool` (a model API's rate limit, say);
    the grant is recorded in the step's ``node_finished``."""
    _check_options(name, version, retry)
    _check_limit(name, limit)

    def register(fn: ToolFn) -> Tool:
        _check_function(name, fn)
        t = Tool(name, fn, "pure", version, retry)
        t.limit = limit
        registry.add(t)
        return t

    return register


def register_verifier(verifier: ResourceVerifier) -> ResourceVerifier:
    """Register ``verifier`` in :data:`registry` (next to the decorated tools, so a module
    loaded with ``--tools`` can bring its verifiers); returns it."""
    registry.add_verifier(verifier)
    return verifier


def load_tools(spec: str) -> None:
    """Import ``spec`` — a dotted module name or a ``.py`` file path — so that its decorators
    register its tools in :data:`registry`.

    A ``.py`` file is imported as ``python FILE`` runs it: its directory goes first on
    ``sys.path`` (and stays there, for imports its functions make later), so that it can import
    the modules beside it.

    Raises:
        ConfigError: the module or file cannot be found or fails to import.
    """
    try:
        if spec.endswith(".py") or "/" in spec:
            path = Path(spec)
            if not path.is_file():
                raise ConfigError(f"tools file {spec!r} not found")
            name = f"affidavit_tools_{path.stem}"
            loaded = getattr(sys.modules.get(name), "__file__", None)
            if loaded is not None and Path(loaded).resolve() == path.resolve():
                return  # imported already, as a dotted name is imported once
            directory = str(path.resolve().parent)
            if directory not in sys.path:
                sys.path.insert(0, directory)
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ConfigError(f"cannot import tools file {spec!r}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            importlib.import_module(spec)
    except AffidavitError:
        raise
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing is not None and missing != spec and not spec.startswith(f"{missing}."):
            hint = (  # the module was found: something it imports was not
                f"The tools module imports {missing!r}, which cannot be found: install it, or "
                "put it on PYTHONPATH (a .py file's own directory is searched too)."
            )
        else:
            hint = "Pass a dotted module name on PYTHONPATH or a path to a .py file."
        raise ConfigError(f"cannot import tools module {spec!r}: {exc}", hint=hint) from exc
    except (Exception, SystemExit) as exc:  # the user's module raised while importing
        raise ConfigError(
            f"tools module {spec!r} failed to import: {exc!r}",
            hint="Fix the error in the tools module; --verbose shows the traceback.",
        ) from exc
