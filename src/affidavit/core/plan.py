"""Plans: the task graph a job executes (docs/formats.md §2 and §7).

A plan file (JSON or YAML) has optional plan-level settings (``name``, ``in_flight``,
``replay_verification``, ``retry``) and ``nodes``. The task graph is ``{"nodes": [...]}`` with the
nodes *exactly* as parsed — no defaults filled in — because ``plan_hash`` is computed over it and
outside verifiers recompute that hash from the recorded ``plan_generated`` event.

Validation (each failure is a :class:`PlanError` subclass naming the node):

(1) shape: ``nodes`` is a non-empty list of objects with the known fields and types;
(2) ``id`` is unique and well-formed; ``type`` is one of tool, pure, wait, approval;
(3) every ``depends_on`` entry names a node of the plan;
(4) the graph has no cycle;
(5) every ``${...}`` reference names ``input`` or an ancestor of the node.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import io
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.canonical import canonical, loads_unique
from affidavit.core.errors import (
    AffidavitError,
    BadReferenceError,
    CycleError,
    DanglingDependencyError,
    DuplicateNodeError,
    PlanError,
    UnknownNodeTypeError,
)
from affidavit.core.inputs import InputTooLarge, read_limited_text

NodeType = Literal["tool", "pure", "wait", "approval", "job"]
NODE_TYPES: tuple[str, ...] = ("tool", "pure", "wait", "approval", "job")
IN_FLIGHT_POLICIES: tuple[str, ...] = ("park", "fail")
REPLAY_MODES: tuple[str, ...] = ("strict", "warn", "human")

_PLAN_FIELDS = frozenset({"name", "nodes", "in_flight", "replay_verification", "retry"})
_NODE_FIELDS = frozenset(
    {
        "id",
        "type",
        "tool",
        "args",
        "depends_on",
        "timeout_seconds",
        "approvers",
        "min_approvals",
        "agent",  # a job node: the child's agent (a registered name) ...
        "plan",  # ... or its plan (a plan file's path)
        "input",  # ... and its input, with ${...} references
        "queue",  # ... and the queue the child runs in (its limits apply to it)
    }
)
_RETRY_FIELDS = frozenset({"max_attempts", "backoff_seconds"})
_NODE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")
REFERENCE = re.compile(r"\$\{([^}]*)\}")
_RESERVED_IDS = frozenset({"input"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_seconds: float = 1.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Plan-level settings, recorded in ``plan_generated.policy``."""

    in_flight: str = "park"
    replay_verification: str = "strict"
    retry: RetryPolicy = RetryPolicy()

    def to_dict(self) -> dict[str, Any]:
        backoff = self.retry.backoff_seconds
        return {
            "in_flight": self.in_flight,
            "replay_verification": self.replay_verification,
            "retry": {
                "max_attempts": self.retry.max_attempts,
                # JCS writes 1.0 as 1 anyway; as an int it keeps the recorded plan (often
                # thousands of nodes) on the fast canonical encoder.
                "backoff_seconds": int(backoff) if backoff.is_integer() else backoff,
            },
        }


@dataclass(frozen=True, slots=True)
class Node:
    """One validated node. ``raw`` is the node object exactly as submitted."""

    id: str
    type: str
    tool: str | None
    args: Mapping[str, Any]
    depends_on: tuple[str, ...]
    timeout_seconds: float | None
    raw: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated plan; build one with :meth:`parse`, :meth:`from_text` or :meth:`from_file`."""

    name: str | None
    nodes: tuple[Node, ...]
    task_graph: Mapping[str, Any]
    plan_hash: str
    order: tuple[str, ...]
    """Node ids in the canonical topological order that step ids are numbered by."""
    policy: Policy
    by_id: Mapping[str, Node] = field(default_factory=dict, repr=False, compare=False)

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path, *, max_bytes: int | None = None) -> Plan:
        """Read and validate a ``.json``, ``.yaml`` or ``.yml`` plan file of at most
        ``max_bytes`` (default :func:`~affidavit.core.config.max_input_bytes`, 64 MiB).

        Raises:
            PlanError: unreadable, larger than the limit, or not a valid plan.
        """
        p = Path(path)
        try:
            text = read_limited_text(p, "plan file", limit=max_bytes)
        except InputTooLarge as exc:
            raise PlanError(exc.message, hint=exc.hint) from None
        except OSError as exc:
            raise PlanError(f"cannot read plan file {str(p)!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise PlanError(
                f"plan file {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from exc
        fmt: Literal["json", "yaml"] = "json" if p.suffix.lower() == ".json" else "yaml"
        return cls.from_text(text, fmt, source=str(p))

    @classmethod
    def from_text(
        cls, text: str, fmt: Literal["json", "yaml"] = "yaml", *, source: str = "<plan>"
    ) -> Plan:
        """Parse plan text (YAML is a superset of JSON, so ``yaml`` reads both)."""
        if fmt == "json":
            try:
                data = loads_unique(text)
            except ValueError as exc:  # not JSON, or a key given twice
                raise PlanError(f"{source} is not valid JSON: {exc}") from exc
            return cls.parse(data)
        import yaml  # only YAML plans need it (and it is slow to import)

        stream = io.StringIO(text)
        stream.name = source  # (what YAML's errors name: "<unicode string>" otherwise)
        loader = _unique_key_loader()(stream)  # a SafeLoader
        try:
            root = loader.get_single_node()
            if root is not None:
                _check_aliases(root, source)
            data = loader.construct_document(root) if root is not None else None
        except yaml.YAMLError as exc:
            raise PlanError(f"{source} is not valid {fmt.upper()}: {exc}") from exc
        except RecursionError:
            raise PlanError(
                f"{source} is not valid {fmt.upper()}: sequences and mappings are nested too "
                "deeply to be read"
            ) from None
        finally:
            loader.dispose()
        return cls.parse(data)

    @classmethod
    def parse(cls, data: Any) -> Plan:
        """Validate a parsed plan object; see the module docstring for the checks."""
        if not isinstance(data, dict):
            raise PlanError("a plan must be an object with a `nodes` list")
        unknown = sorted(set(map(str, data)) - _PLAN_FIELDS)
        if unknown:
            raise PlanError(f"unknown plan field(s): {', '.join(unknown)}")
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise PlanError("plan `name` must be a string")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise PlanError("a plan needs a non-empty `nodes` list")
        nodes = tuple(_parse_node(raw, i) for i, raw in enumerate(raw_nodes))  # (1), (2)
        by_id: dict[str, Node] = {}
        for node in nodes:
            if node.id in by_id:
                raise DuplicateNodeError(f"duplicate node id {node.id!r}", node_id=node.id)
            by_id[node.id] = node
        for node in nodes:  # (3)
            for dep in node.depends_on:
                if dep not in by_id:
                    raise DanglingDependencyError(
                        f"node {node.id!r} depends on {dep!r}, which is not a node of this plan",
                        node_id=node.id,
                    )
        order = topological_order(nodes)  # (4)
        deps = {n.id: n.depends_on for n in nodes}
        for node in nodes:  # (5)
            for ref in iter_references(node.args):
                root = ref.split(".", 1)[0]
                if root == "input":
                    continue
                if root not in by_id:
                    raise BadReferenceError(
                        f"node {node.id!r} references ${{{ref}}}, but {root!r} is not a node",
                        node_id=node.id,
                    )
                if not _is_ancestor(root, node.id, deps):
                    raise BadReferenceError(
                        f"node {node.id!r} references ${{{ref}}}, but {root!r} is not among "
                        "its dependencies",
                        node_id=node.id,
                    )
        task_graph = {"nodes": raw_nodes}
        try:
            graph_bytes = canonical(task_graph)
        except AffidavitError as exc:
            raise PlanError(f"plan is not representable as canonical JSON: {exc.message}") from exc
        return cls(
            name=name,
            nodes=nodes,
            task_graph=task_graph,
            plan_hash=hashlib.sha256(graph_bytes).hexdigest(),
            order=order,
            policy=_parse_policy(data),
            by_id=by_id,
        )

    @classmethod
    def of_recorded_graph(cls, graph: Any, plan_hash: str | None = None) -> Plan:
        """``Plan.parse(graph)`` for a task graph read from a log (``{"nodes": [...]}``, parsed
        JSON, as a ``plan_generated`` event holds it), reusing the plan this process parsed
        from an equal recorded graph that the event's ``plan_hash`` names: a worker runs many
        jobs of one plan, and a long plan costs milliseconds to parse. Only graphs read from
        a log are kept (parsed JSON: no float that was an int, no tuple or enum that a caller's
        own objects could hold), and the graph is compared in full, so the plan returned is
        the one ``parse`` would return."""
        if isinstance(plan_hash, str):
            with _known_lock:
                known = _known_graphs.get(plan_hash)
            if known is not None and known.task_graph == graph:
                with _known_lock:
                    if plan_hash in _known_graphs:
                        _known_graphs.move_to_end(plan_hash)
                return known
        plan = cls.parse(graph)
        with _known_lock:
            _known_graphs[plan.plan_hash] = plan
            while len(_known_graphs) > _KNOWN_GRAPHS:
                _known_graphs.popitem(last=False)
        return plan

    # --- identity ---------------------------------------------------------------------------

    @property
    def decision_id(self) -> str:
        return self.plan_hash[:16]

    def step_ids(self, job_id: str) -> dict[str, str]:
        """Deterministic ``step_id`` of every node for ``job_id`` (docs/formats.md §2)."""
        types = {n.id: n.type for n in self.nodes}
        return {
            node_id: step_id(job_id, self.decision_id, index, types[node_id])
            for index, node_id in enumerate(self.order)
        }

    def node(self, node_id: str) -> Node:
        """The node with this id (``KeyError`` if none)."""
        return self.by_id[node_id]

    def sinks(self) -> tuple[str, ...]:
        """Nodes no other node depends on, in canonical order (their outputs form the job's)."""
        depended = {dep for n in self.nodes for dep in n.depends_on}
        return tuple(node_id for node_id in self.order if node_id not in depended)


def step_id(job_id: str, decision_id: str, index: int, node_type: str) -> str:
    """``first16(hex(SHA-256(job_id ‖ 0 ‖ decision_id ‖ 0 ‖ index ‖ 0 ‖ node_type)))``."""
    data = b"\x00".join(
        (job_id.encode(), decision_id.encode(), str(index).encode(), node_type.encode())
    )
    return hashlib.sha256(data).hexdigest()[:16]


def idempotency_key(job_id: str, step: str, tool_name: str, resolved_args: Any) -> str:
    """Internal ledger key: hex(SHA-256(job_id ‖ 0 ‖ step_id ‖ 0 ‖ tool ‖ 0 ‖ JCS(args)))."""
    return idempotency_key_of(job_id, step, tool_name, canonical(resolved_args))


def idempotency_key_of(job_id: str, step: str, tool_name: str, args_jcs: bytes) -> str:
    """:func:`idempotency_key` from the arguments' canonical bytes (already encoded)."""
    data = b"\x00".join((job_id.encode(), step.encode(), tool_name.encode(), args_jcs))
    return hashlib.sha256(data).hexdigest()


def args_hash(resolved_args: Any) -> str:
    """First 16 hex chars of SHA-256(JCS(resolved_args))."""
    return hashlib.sha256(canonical(resolved_args)).hexdigest()[:16]


def external_key(job_id: str, step: str, attempt_id: str | None) -> str:
    """The key a tool passes downstream: ``affidavit:<job>:<step>:<attempt>``."""
    return f"affidavit:{job_id}:{step}:{attempt_id or '0'}"


def topological_order(nodes: tuple[Node, ...]) -> tuple[str, ...]:
    """Kahn's algorithm with the ready set kept sorted by node id; raises :class:`CycleError`."""
    indegree = {n.id: len(set(n.depends_on)) for n in nodes}
    dependents: dict[str, list[str]] = {n.id: [] for n in nodes}
    for n in nodes:
        for dep in set(n.depends_on):
            dependents[dep].append(n.id)
    ready = sorted(node_id for node_id, d in indegree.items() if d == 0)
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for child in dependents[current]:
            indegree[child] -= 1
            if indegree[child] == 0:
                bisect.insort(ready, child)
    if len(order) != len(nodes):
        stuck = sorted(node_id for node_id, d in indegree.items() if d > 0)
        raise CycleError(
            f"the plan has a dependency cycle through node(s) {', '.join(map(repr, stuck))}",
            node_id=stuck[0],
        )
    return tuple(order)


def iter_references(value: Any) -> Iterator[str]:
    """Every ``${...}`` reference inside a (nested) args value, as the text between braces."""
    if isinstance(value, str):
        for match in REFERENCE.finditer(value):
            yield match.group(1).strip()
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_references(item)
    elif isinstance(value, list):
        for item in value:
            yield from iter_references(item)


def _is_ancestor(candidate: str, node_id: str, deps: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether ``candidate`` is reachable from ``node_id`` through ``depends_on`` (a direct
    dependency is the common case and costs one lookup; no per-node ancestor sets, which would
    make validation quadratic in a long chain)."""
    if candidate in deps[node_id]:
        return True
    seen: set[str] = set()
    stack = list(deps[node_id])
    while stack:
        current = stack.pop()
        if current == candidate:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(deps[current])
    return False


# The most values a YAML plan may stand for once its aliases are expanded: an alias repeats a
# value without repeating its text, so nine lines can stand for 9^9 values ("billion laughs"),
# which every later walk (references, canonical JSON) would visit one by one.
MAX_PLAN_VALUES = 1_000_000


def _check_aliases(root: Any, source: str) -> None:
    """Refuse a composed YAML document that contains itself (an alias inside its own anchor:
    no finite value) or that stands for more than :data:`MAX_PLAN_VALUES` values with its
    aliases expanded — counted over the composed nodes, each once, before anything is built.

    Raises:
        PlanError: either.
    """
    sizes: dict[int, int] = {}  # id(node) -> values it stands for, expanded
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = _yaml_children(node)
        if children_done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(k)] for k in kids)
            if size > MAX_PLAN_VALUES:
                raise PlanError(
                    f"{source} stands for more than {MAX_PLAN_VALUES:,} values once its YAML "
                    f"aliases are expanded (line {node.start_mark.line + 1})",
                    hint="Write the values out, or use fewer nested aliases (*name).",
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        on_path.add(key)
        stack.append((node, True))
        for kid in kids:
            if id(kid) in on_path:
                raise PlanError(
                    f"{source}: the YAML value anchored at line {kid.start_mark.line + 1} "
                    "contains an alias of itself (a value cannot contain itself)",
                    hint="Remove the alias (*name) from inside its own anchor (&name).",
                )
            if id(kid) not in sizes:
                stack.append((kid, False))


def _yaml_children(node: Any) -> list[Any]:
    """The nodes directly inside a composed YAML node (keys and values of a mapping)."""
    value = node.value
    if not isinstance(value, list):
        return []  # a scalar
    if value and isinstance(value[0], tuple):
        return [part for pair in value for part in pair]
    return list(value)


@functools.cache
def _unique_key_loader() -> Any:
    """A YAML ``SafeLoader`` refusing a mapping key given twice (PyYAML keeps the last); keys
    brought in by a ``<<`` merge may still be overridden, as YAML intends."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                        seen.add(key)
                    except TypeError:  # an unhashable key: refused below as YAML intends
                        continue
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"key {key!r} appears twice in one mapping",
                            key_node.start_mark,
                        )
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _parse_node(raw: Any, index: int) -> Node:
    where = f"node #{index + 1}"
    if not isinstance(raw, dict):
        raise PlanError(f"{where} must be an object")
    node_id = raw.get("id")
    if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
        raise PlanError(
            f"{where} has an invalid id {node_id!r}",
            hint="A node id is a non-empty string of letters, digits, '_' and '-', "
            "not starting with a digit or '-'.",
        )
    if node_id in _RESERVED_IDS:
        raise PlanError(f"node id {node_id!r} is reserved", node_id=node_id)
    unknown = sorted(set(map(str, raw)) - _NODE_FIELDS)
    if unknown:
        raise PlanError(
            f"node {node_id!r} has unknown field(s): {', '.join(unknown)}",
            node_id=node_id,
            hint=f"Node fields are: {', '.join(sorted(_NODE_FIELDS))}.",
        )
    node_type = raw.get("type")
    if node_type not in NODE_TYPES:
        raise UnknownNodeTypeError(
            f"node {node_id!r} has unknown type {node_type!r}", node_id=node_id
        )
    tool = raw.get("tool")
    if node_type in ("tool", "pure"):
        if not isinstance(tool, str) or not tool:
            raise PlanError(f"{node_type} node {node_id!r} needs a `tool` name", node_id=node_id)
    elif tool is not None:
        raise PlanError(f"{node_type} node {node_id!r} cannot name a tool", node_id=node_id)
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise PlanError(f"node {node_id!r}: `args` must be an object", node_id=node_id)
    if node_type == "job":
        args = _job_node_args(node_id, raw)
    elif {"agent", "plan", "input", "queue"} & set(raw):
        raise PlanError(
            f"{node_type} node {node_id!r}: only a job node names agent, plan, input, queue"
        )
    depends_on = raw.get("depends_on", [])
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise PlanError(
            f"node {node_id!r}: `depends_on` must be a list of node ids", node_id=node_id
        )
    if node_id in depends_on:
        raise CycleError(f"node {node_id!r} depends on itself", node_id=node_id)
    if node_type == "approval":  # who may decide it (core.approvals)
        ApprovalPolicy.parse(raw.get("approvers"), raw.get("min_approvals"), f"node {node_id!r}")
    elif "approvers" in raw or "min_approvals" in raw:
        raise PlanError(f"{node_type} node {node_id!r}: only an approval node names approvers")
    timeout = raw.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise PlanError(
            f"node {node_id!r}: `timeout_seconds` must be a positive number", node_id=node_id
        )
    return Node(
        id=node_id,
        type=node_type,
        tool=tool,
        args=args,
        depends_on=tuple(depends_on),
        timeout_seconds=float(timeout) if timeout is not None else None,
        raw=raw,
    )


def _job_node_args(node_id: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """A job node's ``agent`` or ``plan`` and ``input``, as the args its ``${...}`` references
    are checked and resolved in."""
    where = f"job node {node_id!r}"
    if "args" in raw:
        raise PlanError(f"{where}: the child's input is `input`, not `args`", node_id=node_id)
    named = [k for k in ("agent", "plan") if k in raw]
    if len(named) != 1 or not isinstance(raw[named[0]], str) or not raw[named[0]]:
        raise PlanError(
            f"{where} needs exactly one of `agent` (a registered agent's name) or `plan` (a "
            "plan file's path), as text",
            node_id=node_id,
        )
    args = {named[0]: raw[named[0]], "input": raw.get("input", {})}
    if "queue" in raw:  # a name, not a reference: the submission checks the queue exists
        queue = raw["queue"]
        if not isinstance(queue, str) or not queue or REFERENCE.search(queue):
            raise PlanError(
                f"{where}: `queue` is the name of a queue, as text (no ${{...}} reference)",
                node_id=node_id,
            )
        args["queue"] = queue
    return args


# Plans parsed in this process from recorded task graphs, by plan hash, the most recently used
# last: see Plan.of_recorded_graph.
_KNOWN_GRAPHS = 16
_known_graphs: OrderedDict[str, Plan] = OrderedDict()
_known_lock = threading.Lock()


def _parse_policy(data: dict[str, Any]) -> Policy:
    in_flight = data.get("in_flight", "park")
    if in_flight not in IN_FLIGHT_POLICIES:
        raise PlanError(f"`in_flight` must be one of park, fail (got {in_flight!r})")
    replay = data.get("replay_verification", "strict")
    if replay not in REPLAY_MODES:
        raise PlanError(
            f"`replay_verification` must be one of strict, warn, human (got {replay!r})"
        )
    retry_raw = data.get("retry", {})
    if not isinstance(retry_raw, dict) or set(map(str, retry_raw)) - _RETRY_FIELDS:
        raise PlanError("`retry` must be an object with max_attempts and/or backoff_seconds")
    max_attempts = retry_raw.get("max_attempts", 3)
    backoff = retry_raw.get("backoff_seconds", 1.0)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise PlanError("`retry.max_attempts` must be an integer ≥ 1")
    if (
        isinstance(backoff, bool)
        or not isinstance(backoff, int | float)
        or not 0 <= backoff <= sys.float_info.max  # NaN, infinities and 10**400 fail it
    ):
        raise PlanError("`retry.backoff_seconds` must be a finite number ≥ 0")
    return Policy(in_flight, replay, RetryPolicy(max_attempts, float(backoff)))
