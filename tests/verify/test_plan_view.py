"""Property: the verifier's plan view derives what the runtime derives.

``read_plan`` computes the canonical order with a heap and the step ids from a shared prefix;
here it is compared with a reference built from the runtime's own ``topological_order`` and
``step_id`` (the view as it was before it was made fast) on generated task graphs — DAGs,
graphs with cycles, repeated and dangling dependencies, and malformed nodes — for the same view
or the same error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.canonical import canonical_sha256
from affidavit.core.errors import AffidavitError
from affidavit.core.plan import NODE_TYPES, Node, Plan, step_id, topological_order
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._plan import PlanProblem, PlanView, canonical_order, read_plan

JOB = "01a20358-1dfc-7014-851a-5d38e3f03675"


def reference_read_plan(graph: Any, recorded_hash: Any, job_id: str) -> PlanView:
    """The plan view through ``Node`` objects and the runtime's functions."""
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
        nodes.append(Node(node_id, node_type, None, {}, tuple(depends_on), None, raw))
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
        plan_hash = canonical_sha256(graph)
    types = {n.id: n.type for n in nodes}
    return PlanView(
        plan_hash=plan_hash,
        steps={n: step_id(job_id, plan_hash[:16], i, types[n]) for i, n in enumerate(order)},
        node_type=types,
        deps={n.id: list(n.depends_on) for n in nodes},
        order=order,
        tools={n.id: n.raw.get("tool") for n in nodes if n.type == "tool"},
    )


def outcome(graph: Any, recorded_hash: Any, fn: Any) -> PlanView | str:
    try:
        return fn(graph, recorded_hash, JOB)
    except PlanProblem as exc:
        return f"PlanProblem: {exc}"


# Few distinct ids, so that dependencies often repeat, dangle or close a cycle; some ids sort
# differently by code point than by UTF-16 (docs/formats.md §2 sorts as Python does).
IDS = st.sampled_from(["a", "b", "c", "d", "e", "B", "a1", "é", "\U0001f600", "ﬀ"])


@st.composite
def nodes(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 30)) == 0:  # now and then a node that is not a node at all
        return draw(st.sampled_from([None, 1, "a", []]))
    node: dict[str, Any] = {"id": draw(IDS | st.sampled_from(["", None, 3]))}
    node["type"] = draw(st.sampled_from([*NODE_TYPES, "bogus"]))
    if draw(st.booleans()):
        node["depends_on"] = draw(st.lists(IDS, max_size=4) | st.sampled_from([None, [1], "a"]))
    return node


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed task graph: each node depends only on nodes listed before it (so no cycle),
    listed in a shuffled order."""
    count = draw(st.integers(1, 12))
    ids = [f"n{i}" for i in range(count)]
    graph_nodes = []
    for i, node_id in enumerate(ids):
        node: dict[str, Any] = {"id": node_id, "type": draw(st.sampled_from(NODE_TYPES))}
        if i:
            node["depends_on"] = draw(st.lists(st.sampled_from(ids[:i]), max_size=3))
        graph_nodes.append(node)
    return {"nodes": draw(st.permutations(graph_nodes))}


@settings(max_examples=400, deadline=None)
@given(graph=st.fixed_dictionaries({"nodes": st.lists(nodes(), min_size=1, max_size=8)}))
def test_any_graph_gives_the_same_view_or_error(graph: dict[str, Any]) -> None:
    for recorded in (None, canonical_sha256(graph), "0" * 64):
        assert outcome(graph, recorded, read_plan) == outcome(graph, recorded, reference_read_plan)


@settings(max_examples=300, deadline=None)
@given(graph=dags())
def test_a_dag_gives_the_runtimes_order_and_step_ids(graph: dict[str, Any]) -> None:
    view = read_plan(graph, None, JOB)
    plan = Plan.parse(
        {
            "nodes": [
                {**n, "tool": "t"}
                if n["type"] in ("tool", "pure")
                else {**n, "agent": "a"}
                if n["type"] == "job"
                else n
                for n in graph["nodes"]
            ]
        }
    )
    assert view.order == plan.order
    assert view.steps == {
        n: step_id(JOB, view.plan_hash[:16], i, view.node_type[n]) for i, n in enumerate(plan.order)
    }
    assert view == reference_read_plan(graph, None, JOB)


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        ({"nodes": [{"id": "a", "type": "pure", "depends_on": ["a"]}]}, "'a'"),
        (
            {
                "nodes": [
                    {"id": "a", "type": "pure"},
                    {"id": "c", "type": "pure", "depends_on": ["b", "a"]},
                    {"id": "b", "type": "pure", "depends_on": ["c"]},
                ]
            },
            "'b', 'c'",
        ),
    ],
)
def test_a_cycle_is_named_as_the_runtime_names_it(graph: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanProblem, match=f"dependency cycle through node\\(s\\) {message}$"):
        read_plan(graph, None, JOB)


def test_a_long_chain_and_a_wide_fan() -> None:
    """The shapes of real plans at size: the order is the runtime's either way."""
    chain = {f"s{i:05d}": [f"s{i - 1:05d}"] if i else [] for i in range(5000)}
    assert canonical_order(chain) == tuple(sorted(chain))
    fan = {"root": [], **{f"leaf{i}": ["root"] for i in range(3000, 0, -1)}}
    assert canonical_order(fan) == ("root", *sorted(k for k in fan if k != "root"))
