"""The plan as verification needs it: node types, dependencies, the canonical order and step ids.

The task graph was fully validated when the job was submitted (``Plan.parse``: field names,
``${...}`` references, tool names). Verification re-derives, from the recorded graph, exactly
what its checks rest on — unique typed nodes, dependencies that exist and form no cycle, the
plan hash and the step ids (FORMATS.md §2, with the same ``topological_order`` and ``step_id``
the runtime uses) — without building the full plan objects, which for a plan of many steps is
the largest cost of verifying its log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.core.canonical import canonical_sha256
from affidavit.core.errors import AffidavitError
from affidavit.core.plan import NODE_TYPES, Node, step_id, topological_order
from affidavit.verify._digest import canonical_hash_matches

_NO_ARGS: dict[str, Any] = {}


class PlanProblem(Exception):
    """The recorded task graph cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class PlanView:
    plan_hash: str
    steps: dict[str, str]  # node id -> step id
    node_type: dict[str, str]
    deps: dict[str, tuple[str, ...]]
    order: tuple[str, ...]


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
    nodes: list[Node] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            raise PlanProblem(f"node #{index + 1} is not an object")
        node_id, node_type = raw.get("id"), raw.get("type")
        depends_on = raw.get("depends_on", [])
        if not isinstance(node_id, str) or not node_id or node_id in seen:
            raise PlanProblem(f"node #{index + 1} has a missing or duplicate id {node_id!r}")
        if node_type not in NODE_TYPES:
            raise PlanProblem(f"node {node_id!r} has unknown type {node_type!r}")
        if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
            raise PlanProblem(f"node {node_id!r}: depends_on is not a list of node ids")
        seen.add(node_id)
        nodes.append(Node(node_id, node_type, None, _NO_ARGS, tuple(depends_on), None, raw))
    for node in nodes:
        for dep in node.depends_on:
            if dep not in seen:
                raise PlanProblem(f"node {node.id!r} depends on {dep!r}, which is not a node")
    try:
        order = topological_order(tuple(nodes))
    except AffidavitError as exc:
        raise PlanProblem(exc.message) from exc
    if isinstance(recorded_hash, str):
        if not canonical_hash_matches(graph, recorded_hash):
            raise PlanProblem(f"plan_hash {recorded_hash} does not match the task graph")
        plan_hash = recorded_hash
    else:
        try:
            plan_hash = canonical_sha256(graph)
        except AffidavitError as exc:
            raise PlanProblem(exc.message) from exc
    decision = plan_hash[:16]
    node_type = {n.id: n.type for n in nodes}
    return PlanView(
        plan_hash=plan_hash,
        steps={
            node_id: step_id(job_id, decision, index, node_type[node_id])
            for index, node_id in enumerate(order)
        },
        node_type=node_type,
        deps={n.id: n.depends_on for n in nodes},
        order=order,
    )
