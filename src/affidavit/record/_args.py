"""Resolving ``${...}`` references in a node's args against the job input and node outputs.

A string that is exactly one reference keeps the referenced value's type; references inside a
longer string are interpolated as text (strings as they are, anything else as canonical JSON).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from affidavit.core.canonical import canonical, canonical_text, parse
from affidavit.core.errors import AffidavitError
from affidavit.core.plan import Plan

_EXACT = re.compile(r"^\$\{([^}]*)\}\Z")
_ANY = re.compile(r"\$\{([^}]*)\}")


class ArgsResolutionError(AffidavitError):
    code = "args_unresolvable"
    default_hint = "The reference names a field the input or upstream output does not have."


def _lookup(ref: str, scope: Mapping[str, Any], node_id: str) -> Any:
    root, *path = ref.strip().split(".")
    if root not in scope:
        raise ArgsResolutionError(f"node {node_id!r}: ${{{ref}}} names nothing available")
    value = scope[root]
    walked = root
    for part in path:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif (
            isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            raise ArgsResolutionError(
                f"node {node_id!r}: ${{{ref}}}: {walked!r} has no field {part!r}"
            )
        walked += "." + part
    return value


def resolve(value: Any, scope: Mapping[str, Any], node_id: str) -> Any:
    """Resolve every reference in ``value`` (nested dicts and lists) against ``scope``
    (``{"input": ..., "<node_id>": output, ...}``)."""
    if isinstance(value, str):
        exact = _EXACT.match(value)
        if exact:
            return _lookup(exact.group(1), scope, node_id)
        if "${" not in value:
            return value

        def text(match: re.Match[str]) -> str:
            found = _lookup(match.group(1), scope, node_id)
            return found if isinstance(found, str) else canonical_text(found)

        return _ANY.sub(text, value)
    if isinstance(value, dict):
        return {k: resolve(v, scope, node_id) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, scope, node_id) for v in value]
    return value


def _references(value: Any) -> list[str]:
    """Every ``${...}`` reference in ``value`` (nested dicts and lists)."""
    if isinstance(value, str):
        return _ANY.findall(value) if "${" in value else []
    if isinstance(value, dict):
        return [ref for v in value.values() for ref in _references(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in _references(v)]
    return []


def check_input_references(plan: Plan, job_input: Any) -> None:
    """Every ``${input...}`` reference in the plan's args resolves against ``job_input``:
    checked when a job is submitted, since the input is known then (references to upstream
    outputs can only be resolved when the node runs).

    Raises:
        ArgsResolutionError: naming the node and the reference.
    """
    # as the runtime will see it: read back from the log (a tuple is then a list)
    scope = {"input": parse(canonical(job_input))}
    for node in plan.nodes:
        for ref in _references(node.args):
            if ref.strip().split(".")[0] == "input":
                _lookup(ref, scope, node.id)
