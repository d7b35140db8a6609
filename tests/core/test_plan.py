"""Plan parsing and validation: each invalid kind gets its own error naming the node."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.errors import (
    BadReferenceError,
    CycleError,
    DanglingDependencyError,
    DuplicateNodeError,
    PlanError,
    UnknownNodeTypeError,
)
from affidavit.core.plan import Plan, external_key, step_id, topological_order

REFUND_YAML = """
name: refund-order
in_flight: fail
replay_verification: warn
retry: {max_attempts: 5, backoff_seconds: 0.5}
nodes:
  - id: lookup
    type: tool
    tool: lookup_order
    args: {order_id: "${input.order_id}"}
  - id: decide
    type: pure
    tool: decide_refund
    args: {order: "${lookup}"}
    depends_on: [lookup]
  - id: refund
    type: tool
    tool: issue_refund
    args: {order_id: "${input.order_id}", amount: "${decide.amount}"}
    depends_on: [decide]
"""


def base() -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "a", "type": "tool", "tool": "t1"},
            {"id": "b", "type": "pure", "tool": "t2", "args": {"x": "${a.y}"}, "depends_on": ["a"]},
            {"id": "c", "type": "tool", "tool": "t3", "args": {"v": "${b}"}, "depends_on": ["b"]},
        ]
    }


def test_yaml_and_json_files_give_the_same_plan(tmp_path: Path) -> None:
    yaml_file = tmp_path / "plan.yaml"
    yaml_file.write_text(REFUND_YAML)
    from_yaml = Plan.from_file(yaml_file)
    json_file = tmp_path / "plan.json"
    import yaml

    json_file.write_text(json.dumps(yaml.safe_load(REFUND_YAML)))
    from_json = Plan.from_file(json_file)
    assert from_yaml.plan_hash == from_json.plan_hash
    assert from_yaml.name == "refund-order"
    assert from_yaml.policy.in_flight == "fail"
    assert from_yaml.policy.replay_verification == "warn"
    assert from_yaml.policy.retry.max_attempts == 5
    assert from_yaml.policy.to_dict()["retry"] == {"max_attempts": 5, "backoff_seconds": 0.5}
    # plan-level settings are not part of the task graph
    assert set(from_yaml.task_graph) == {"nodes"}
    assert from_yaml.order == ("lookup", "decide", "refund")
    assert from_yaml.sinks() == ("refund",)


def test_task_graph_is_exactly_as_submitted() -> None:
    raw = base()
    plan = Plan.parse(copy.deepcopy(raw))
    assert plan.task_graph == raw  # no defaults filled in
    assert "args" not in plan.task_graph["nodes"][0]


def test_defaults() -> None:
    plan = Plan.parse(base())
    assert plan.policy.to_dict() == {
        "in_flight": "park",
        "replay_verification": "strict",
        "retry": {"max_attempts": 3, "backoff_seconds": 1.0},
    }


def test_step_order_is_kahn_with_sorted_ready_set() -> None:
    plan = Plan.parse(
        {
            "nodes": [
                {"id": "z", "type": "pure", "tool": "t"},
                {"id": "m", "type": "pure", "tool": "t", "depends_on": ["z"]},
                {"id": "a", "type": "pure", "tool": "t", "depends_on": ["z"]},
                {"id": "b", "type": "pure", "tool": "t"},
            ]
        }
    )
    # ready {b, z} -> b; {z} -> z; {a, m} -> a, m
    assert plan.order == ("b", "z", "a", "m")
    ids = plan.step_ids("job-9")
    assert ids["b"] == step_id("job-9", plan.decision_id, 0, "pure")
    assert ids["m"] == step_id("job-9", plan.decision_id, 3, "pure")
    assert len(set(ids.values())) == 4


def test_external_key() -> None:
    assert external_key("j", "s", "a1") == "affidavit:j:s:a1"
    assert external_key("j", "s", None) == "affidavit:j:s:0"


@pytest.mark.parametrize(
    ("mutate", "error", "node"),
    [
        (lambda p: p["nodes"][1].update(type="robot"), UnknownNodeTypeError, "b"),
        (lambda p: p["nodes"][2].update(id="a", depends_on=[]), DuplicateNodeError, "a"),
        (lambda p: p["nodes"][2].update(depends_on=["b", "ghost"]), DanglingDependencyError, "c"),
        (lambda p: p["nodes"][0].update(depends_on=["c"]), CycleError, "a"),
        (lambda p: p["nodes"][0].update(depends_on=["a"]), CycleError, "a"),
        (lambda p: p["nodes"][1].update(args={"x": "${c}"}), BadReferenceError, "b"),
        (lambda p: p["nodes"][1].update(args={"x": "see ${nobody.y}"}), BadReferenceError, "b"),
        (
            lambda p: p["nodes"].append(
                {"id": "d", "type": "pure", "tool": "t", "args": {"q": ["${a}"]}}
            ),
            BadReferenceError,
            "d",
        ),
    ],
    ids=[
        "unknown_type",
        "duplicate_id",
        "dangling_depends_on",
        "cycle",
        "self_dependency",
        "reference_to_descendant",
        "reference_to_unknown_node",
        "reference_to_unrelated_node_in_list",
    ],
)
def test_invalid_plans(mutate: Any, error: type[PlanError], node: str) -> None:
    plan = base()
    mutate(plan)
    with pytest.raises(error) as info:
        Plan.parse(plan)
    assert info.value.node_id == node
    assert repr(node) in info.value.message
    assert info.value.hint


def test_transitive_ancestor_reference_is_allowed() -> None:
    plan = base()
    plan["nodes"][2]["args"] = {"v": "${a.y}", "w": "text ${input.k} more"}
    Plan.parse(plan)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "must be an object"),
        ({"nodes": []}, "non-empty"),
        ({"nodes": [{"id": "a", "type": "tool"}]}, "needs a `tool`"),
        ({"nodes": [{"id": "a", "type": "wait", "tool": "x"}]}, "cannot name a tool"),
        ({"nodes": [{"id": "a", "type": "tool", "tool": "x", "colour": 1}]}, "unknown field"),
        ({"nodes": [{"id": "1a", "type": "tool", "tool": "x"}]}, "invalid id"),
        ({"nodes": [{"id": "a\n", "type": "tool", "tool": "x"}]}, "invalid id"),
        ({"nodes": [{"id": "input", "type": "tool", "tool": "x"}]}, "reserved"),
        ({"nodes": [{"id": "a", "type": "tool", "tool": "x", "args": []}]}, "`args`"),
        ({"nodes": [{"id": "a", "type": "tool", "tool": "x", "depends_on": "b"}]}, "depends_on"),
        ({"nodes": [{"id": "a", "type": "pure", "tool": "x"}], "in_flight": "ignore"}, "in_flight"),
        (
            {"nodes": [{"id": "a", "type": "pure", "tool": "x"}], "retry": {"max_attempts": 0}},
            "max_attempts",
        ),
        *[
            (
                {
                    "nodes": [{"id": "a", "type": "pure", "tool": "x"}],
                    "retry": {"backoff_seconds": b},
                },
                "backoff_seconds",
            )
            for b in (-1, float("nan"), float("inf"), 10**400)
        ],
        (
            {"nodes": [{"id": "a", "type": "pure", "tool": "x"}], "colour": "red"},
            "unknown plan field",
        ),
        (
            {"nodes": [{"id": "a", "type": "pure", "tool": "x", "args": {"n": float("nan")}}]},
            "canonical",
        ),
    ],
)
def test_malformed_plans(data: Any, fragment: str) -> None:
    with pytest.raises(PlanError) as info:
        Plan.parse(data)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("p.yaml", "nodes:\n  - id: a\n    type: tool\n    tool: t\n    tool: u\n", "line 5"),
        ("p.yaml", "nodes: []\nnodes:\n  - {id: a, type: tool, tool: t}\n", "line 2"),
        ("p.json", '{"nodes": [{"id": "a", "type": "tool", "tool": "t", "tool": "u"}]}', "JSON"),
    ],
    ids=["yaml-node", "yaml-top", "json-node"],
)
def test_a_key_given_twice_is_refused(tmp_path: Path, name: str, text: str, where: str) -> None:
    """A repeated key would otherwise be dropped silently (the last one wins)."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PlanError, match="appears twice") as info:
        Plan.from_file(path)
    assert where in info.value.message


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_plan_nested_too_deeply_to_read_is_a_plan_error(fmt: Literal["json", "yaml"]) -> None:
    """Not a RecursionError out of the parser (a traceback on the command line)."""
    text = '{"nodes": [{"id": "a", "type": "wait", "args": {"v": ' + "[" * 100_000
    text += "]" * 100_000 + "}}]}"
    with pytest.raises(PlanError, match="nested too deeply to be read"):
        Plan.from_text(text, fmt)


def test_yaml_merge_keys_may_still_be_overridden() -> None:
    text = "nodes:\n  - &a {id: a, type: tool, tool: t}\n  - {<<: *a, id: b, tool: u}\n"
    nodes = Plan.from_text(text).task_graph["nodes"]
    assert nodes[1] == {"id": "b", "type": "tool", "tool": "u"}


def alias_levels(levels: int, width: int = 10) -> str:
    """A plan whose args nest ``levels`` levels of YAML aliases, each repeating the level below
    ``width`` times: it stands for about ``width ** levels`` values ("billion laughs")."""
    lines = ["nodes:", "  - id: a", "    type: wait", "    args:"]
    lines.append("      l0: &a0 [" + ", ".join(['"${input.x}"'] * width) + "]")
    for level in range(1, levels):
        lines.append(f"      l{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_expand_past_the_bound_are_refused_before_anything_walks_them(
    tmp_path: Path,
) -> None:
    """Ten lines standing for 10^7 values: refused from the composed document (each node
    counted once), not walked value by value (9^9 hung the reference check for minutes)."""
    path = tmp_path / "laughs.yaml"
    path.write_text(alias_levels(7))
    with pytest.raises(PlanError, match="more than 1,000,000 values") as info:
        Plan.from_file(path)
    assert str(path) in info.value.message and "aliases" in info.value.message
    path.write_text(alias_levels(9, 9))  # the form seen in the wild: 9^9
    with pytest.raises(PlanError, match="more than 1,000,000 values"):
        Plan.from_file(path)
    fine = Plan.from_text(alias_levels(3))  # aliases within the bound are still YAML
    assert len(fine.node("a").args["l2"]) == 10


@pytest.mark.parametrize(
    "text",
    [
        "nodes:\n  - id: a\n    type: wait\n    args: &x\n      me: *x\n",
        "nodes: &n\n  - id: a\n    type: wait\n    args: {v: [[*n]]}\n",
    ],
    ids=["args-contains-itself", "nodes-contain-themselves"],
)
def test_a_yaml_value_containing_itself_is_a_plan_error(tmp_path: Path, text: str) -> None:
    """Not a RecursionError traceback out of the reference walk."""
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match="contains an alias of itself") as info:
        Plan.from_file(path)
    assert info.value.message.startswith(f"{path}: ")


def test_a_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnodes: [ {id: a\n")
    with pytest.raises(PlanError, match="not valid YAML") as info:
        Plan.from_file(path)
    assert f'in "{path}", line 2' in info.value.message
    assert "<unicode string>" not in info.value.message


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        Plan.from_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: [")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_file(bad)


@settings(max_examples=100, deadline=None)
@given(st.permutations(["a", "b", "c", "d", "e"]))
def test_order_does_not_depend_on_node_listing_order(names: list[str]) -> None:
    edges = {"b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []}
    nodes = [
        {"id": n, "type": "pure", "tool": "t", **({"depends_on": edges[n]} if edges.get(n) else {})}
        for n in names
    ]
    plan = Plan.parse({"nodes": nodes})
    assert plan.order == ("a", "b", "c", "d", "e")
    assert topological_order(plan.nodes) == plan.order


def test_a_recorded_graph_is_parsed_once_per_process_and_always_as_parse_would() -> None:
    """``Plan.of_recorded_graph`` reuses the plan parsed from an equal recorded graph that the
    event's plan hash names; a graph that differs (a log whose graph was edited but whose
    plan_hash was kept), an unknown hash or no hash is parsed; a bad graph still fails."""
    import orjson

    from affidavit.core import plan as plan_module
    from affidavit.core.errors import PlanError

    def recorded(n: int) -> dict[str, Any]:  # as a log holds it: parsed JSON
        nodes = [{"id": f"s{k}", "type": "pure", "tool": "t", "args": {"k": k}} for k in range(n)]
        return cast(dict[str, Any], orjson.loads(orjson.dumps({"nodes": nodes})))

    first = Plan.of_recorded_graph(recorded(3), None)
    assert first == Plan.parse(recorded(3))
    again = Plan.of_recorded_graph(recorded(3), first.plan_hash)
    assert again is first  # reused: an equal graph under its hash
    edited = recorded(3)
    edited["nodes"][1]["args"]["k"] = 99
    changed = Plan.of_recorded_graph(edited, first.plan_hash)  # same hash, other graph
    assert changed is not first and changed == Plan.parse(edited)
    assert changed.plan_hash != first.plan_hash
    assert Plan.of_recorded_graph(recorded(3), "0" * 64) == first
    with pytest.raises(PlanError):
        Plan.of_recorded_graph({"nodes": []}, first.plan_hash)
    for n in range(4, 4 + plan_module._KNOWN_GRAPHS + 2):  # the cache stays bounded
        Plan.of_recorded_graph(recorded(n), None)
    assert len(plan_module._known_graphs) == plan_module._KNOWN_GRAPHS
