"""The plan as verification needs it: node types, dependencies, the canonical order and step ids.

The task graph was fully validated when the job was submitted (``Plan.parse``: field names,
``${...}`` references, tool names). Verification re-derives, from the recorded graph, exactly
what its checks rest on — unique typed nodes, dependencies that exist and form no cycle, the
plan hash and the step ids (docs/formats.md §2) — without building the full plan objects, which for
a plan of many steps is the largest cost of verifying its log.

The order and the step ids are computed here with plain dicts and a heap instead of the
runtime's :func:`~affidavit.core.plan.topological_order` (which wants :class:`Node` objects and
keeps its ready set as a sorted list) and one :func:`~affidavit.core.plan.step_id` call per node;
``tests/verify/test_plan_view.py`` checks both against the runtime's functions on generated
graphs. A graph with a cycle is handed to the runtime's function, so that its error names the
same nodes.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from affidavit.core.canonical import canonical_sha256
from affidavit.core.errors import AffidavitError
from affidavit.core.plan import NODE_TYPES, Node, topological_order
from affidavit.verify._digest import canonical_hash_matches

_NO_ARGS: dict[str, Any] = {}
_NO_DEPS: list[str] = []  # the default of a node without ``depends_on`` (never mutated)
_TYPE_SUFFIX = {t: b"\x00" + t.encode() for t in NODE_TYPES}


class PlanProblem(Exception):
    """The recorded task graph cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class PlanView:
    plan_hash: str
    steps: dict[str, str]  # node id -> step id
    node_type: dict[str, str]
    deps: dict[str, list[str]]  # the task graph's own depends_on lists (not to be changed)
    order: tuple[str, ...]
    tools: dict[str, Any]  # tool node id -> its tool's name (the node's ``tool``)


def read_plan(graph: Any, recorded_hash: Any, job_id: str) -> PlanView:
    """Derive the :class:`PlanView` of a recorded task graph.

    Raises:
        PlanProblem: not a DAG of uniquely named, typed nodes, or the recorded plan hash does
            not match the graph.
    """
    if not isinstance(graph, dict) or set(graph) != {"nodes"}:
        raise PlanProblem("the task graph must be exactly {'nodes': [...]}")
    raw_nodes = graph["nodes"]
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise PlanProblem("the task graph has no nodes")
    # One pass checks each node and sets up Kahn's algorithm (see canonical_order).
    node_type: dict[str, str] = {}
    deps: dict[str, list[str]] = {}
    tools: dict[str, Any] = {}
    kahn = _Kahn()
    for index, raw in enumerate(raw_nodes, start=1):
        if not isinstance(raw, dict):
            raise PlanProblem(f"node #{index} is not an object")
        get = raw.get
        node_id, kind, depends_on = get("id"), get("type"), get("depends_on", _NO_DEPS)
        if not isinstance(node_id, str) or not node_id or node_id in node_type:
            raise PlanProblem(f"node #{index} has a missing or duplicate id {node_id!r}")
        if kind not in NODE_TYPES:
            raise PlanProblem(f"node {node_id!r} has unknown type {kind!r}")
        if not isinstance(depends_on, list):
            raise PlanProblem(f"node {node_id!r}: depends_on is not a list of node ids")
        for dep in depends_on:
            if not isinstance(dep, str):
                raise PlanProblem(f"node {node_id!r}: depends_on is not a list of node ids")
        node_type[node_id] = kind
        if kind == "tool":
            tools[node_id] = get("tool")
        deps[node_id] = depends_on  # not copied: a tuple per node costs more than it saves
        kahn.add(node_id, depends_on)
    order = kahn.order()
    if len(order) != len(deps):  # a dependency that is not a node, or a cycle
        for node_id, node_deps in deps.items():
            for dep in node_deps:
                if dep not in node_type:
                    raise PlanProblem(f"node {node_id!r} depends on {dep!r}, which is not a node")
        _raise_cycle(deps)
    if isinstance(recorded_hash, str):
        if not canonical_hash_matches(graph, recorded_hash):
            raise PlanProblem(f"plan_hash {recorded_hash} does not match the task graph")
        plan_hash = recorded_hash
    else:
        try:
            plan_hash = canonical_sha256(graph)
        except AffidavitError as exc:
            raise PlanProblem(exc.message) from exc
    return PlanView(
        plan_hash=plan_hash,
        steps=step_ids(job_id, plan_hash[:16], order, node_type),
        node_type=node_type,
        deps=deps,
        order=order,
        tools=tools,
    )


def canonical_order(deps: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """docs/formats.md §2's order of the nodes (``deps``: node id -> its dependencies, every one a
    node): Kahn's algorithm taking the smallest ready node id each time.

    Raises:
        PlanProblem: the graph has a cycle (named as the runtime names it).
    """
    kahn = _Kahn()
    for node_id, node_deps in deps.items():
        kahn.add(node_id, node_deps)
    order = kahn.order()
    if len(order) != len(deps):
        _raise_cycle(deps)
    return order


class _Kahn:
    """Kahn's algorithm with a heap for the ready set: which nodes are ready depends only on
    which were taken, not on the order their counts were decremented in, so taking the smallest
    ready id from a heap gives the order the runtime's sorted ready list gives."""

    __slots__ = ("dependents", "ready", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}  # node id -> dependencies not taken yet (distinct)
        # node id -> the nodes depending on it: one id, or a list of them (most nodes of a plan
        # have at most one dependent, and a list per node is most of the garbage collector's work)
        self.dependents: dict[str, str | list[str]] = {}
        self.ready: list[str] = []

    def add(self, node_id: str, node_deps: Sequence[str]) -> None:
        if not node_deps:
            self.ready.append(node_id)
            return
        distinct = node_deps if len(node_deps) == 1 else set(node_deps)
        self.waiting[node_id] = len(distinct)
        dependents = self.dependents
        for dep in distinct:
            children = dependents.get(dep)
            if children is None:
                dependents[dep] = node_id
            elif isinstance(children, str):
                dependents[dep] = [children, node_id]
            else:
                children.append(node_id)

    def order(self) -> tuple[str, ...]:
        """The nodes in order; fewer than were added when some dependency is never taken (it
        is not a node, or it is on a cycle)."""
        ready, waiting = self.ready, self.waiting
        heapq.heapify(ready)
        pop, push, get = heapq.heappop, heapq.heappush, self.dependents.get
        order: list[str] = []
        append = order.append
        while ready:
            current = pop(ready)
            append(current)
            children = get(current)
            if children is None:
                continue
            for child in (children,) if isinstance(children, str) else children:
                left = waiting[child] - 1
                waiting[child] = left
                if not left:
                    push(ready, child)
        return tuple(order)


def _raise_cycle(deps: Mapping[str, Sequence[str]]) -> NoReturn:
    nodes = tuple(Node(n, "", None, _NO_ARGS, tuple(d), None, _NO_ARGS) for n, d in deps.items())
    try:
        topological_order(nodes)  # raises the runtime's CycleError naming the stuck nodes
    except AffidavitError as exc:
        raise PlanProblem(exc.message) from exc
    raise AssertionError("canonical_order and topological_order disagree")  # pragma: no cover


def step_ids(
    job_id: str, decision_id: str, order: tuple[str, ...], node_type: dict[str, str]
) -> dict[str, str]:
    """:func:`~affidavit.core.plan.step_id` of every node, by its index in ``order``: the same
    bytes hashed, with the constant ``job_id ‖ 0 ‖ decision_id ‖ 0`` prefix built once."""
    prefix = b"\x00".join((job_id.encode(), decision_id.encode(), b""))
    suffix = _TYPE_SUFFIX
    sha256 = hashlib.sha256
    return {
        node_id: sha256(b"%b%d%b" % (prefix, index, suffix[node_type[node_id]])).hexdigest()[:16]
        for index, node_id in enumerate(order)
    }
