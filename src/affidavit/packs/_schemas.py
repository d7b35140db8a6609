"""The JSON Schemas a pack is validated against (shipped in ``affidavit/packs/schemas``), with
errors as ``path: message``; an episode contract is validated once per distinct step shape."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import orjson

from affidavit.packs import _format as F


@cache
def _validator(name: str) -> Any:
    import jsonschema  # type: ignore[import-untyped]
    from referencing import Registry, Resource

    schema = F.schema(name)
    if name == "pack_manifest.schema.json":
        attestation = F.schema("attestation.schema.json")
        registry: Registry[Any] = Registry().with_resource(
            attestation["$id"], Resource.from_contents(attestation)
        )
        return jsonschema.Draft202012Validator(schema, registry=registry)
    if name == "attestation.schema.json":
        return jsonschema.Draft202012Validator(schema)
    return jsonschema.Draft7Validator(schema)


def _raw_schema_errors(name: str, value: Any) -> list[tuple[tuple[Any, ...], str]]:
    try:
        found = sorted(_validator(name).iter_errors(value), key=lambda e: list(map(str, e.path)))
    except RecursionError:
        return [((), "nested too deeply to validate")]
    return [(tuple(e.absolute_path), e.message[:300]) for e in found]


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "(root)"


def schema_errors(name: str, value: Any) -> list[str]:
    """Validation errors of ``value`` against one of the shipped schemas, as ``path: message``."""
    return [f"{_where(path)}: {message}" for path, message in _raw_schema_errors(name, value)]


def _step_shape(step: Any) -> Any:
    """``step`` with its step id and dependency names replaced by placeholders when they are
    strings (unique, for ``depends_on``): the schema constrains them only to be that, so two
    steps of one shape are valid or invalid together."""
    if not isinstance(step, dict):
        return step
    shape = dict(step)
    if isinstance(shape.get("step_id"), str):
        shape["step_id"] = "s"
    deps = shape.get("depends_on")
    if (
        isinstance(deps, list)
        and all(isinstance(d, str) for d in deps)
        and len(set(deps)) == len(deps)
    ):
        shape["depends_on"] = [f"d{i}" for i in range(len(deps))]
    return shape


def _shape_key(shape: Any, index: int) -> str | bytes:
    """A key equal for two shapes exactly when they are the same JSON value (1, 1.0 and true
    apart): orjson's sorted output, unless it holds ``null`` — orjson writes infinities (which
    a fallback parse can yield) as ``null`` too — or orjson refuses the value; then the JSON
    text, as before orjson was used here (a str key never equals a bytes key)."""
    try:
        key = orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    else:
        if b"null" not in key:
            return key
    try:
        return json.dumps(shape, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return f"#{index}"


def contract_schema_errors(contract: Any) -> list[str]:
    """:func:`schema_errors` for an episode contract, validating each distinct step shape once
    (a 10,000-step script has a handful) and reporting errors at every step of that shape."""
    name = F.SCHEMA_NAMES[2]
    script = contract.get("replay_script") if isinstance(contract, dict) else None
    steps = script.get("steps") if isinstance(script, dict) else None
    if not isinstance(script, dict) or not isinstance(steps, list) or len(steps) < 32:
        return schema_errors(name, contract)
    index: dict[str | bytes, int] = {}
    reps: list[Any] = []
    owners: list[list[int]] = []
    for i, step in enumerate(steps):
        shape = _step_shape(step)
        key = _shape_key(shape, i)
        if key not in index:
            index[key] = len(reps)
            reps.append(shape)
            owners.append([])
        owners[index[key]].append(i)
    probe = {**contract, "replay_script": {**script, "steps": reps}}
    out: list[str] = []
    for path, message in _raw_schema_errors(name, probe):
        if len(path) >= 3 and path[:2] == ("replay_script", "steps") and type(path[2]) is int:
            for i in owners[path[2]]:
                out.append(f"{_where(('replay_script', 'steps', i, *path[3:]))}: {message}")
        else:
            out.append(f"{_where(path)}: {message}")
    return out
