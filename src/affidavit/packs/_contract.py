"""Phase 1 of docs/packs.md: the episode contract — its schema, the environment fingerprint
recomputed, and a usable step graph (unique ids, known dependencies, no cycle, a terminal
``EMIT_OUTPUT``)."""

from __future__ import annotations

from typing import Any

from affidavit.packs import _format as F
from affidavit.packs._files import read
from affidavit.packs._json import hash_value, parse
from affidavit.packs._schemas import contract_schema_errors
from affidavit.packs._state import Fail, State


def check_contract(st: State) -> list[dict[str, Any]]:
    """Contract checks; the steps in DAG order (empty when the DAG is unusable)."""
    try:
        contract, strict = parse(
            read(st.root / F.CONTRACT, F.CONTRACT, st.max_file_bytes), F.CONTRACT
        )
    except Fail as exc:
        st.errors.append(str(exc))
        return []
    if not isinstance(contract, dict):
        st.errors.append(f"{F.CONTRACT}: not a JSON object")
        return []
    st.contract, st.contract_strict = contract, strict
    st.errors.extend(f"{F.CONTRACT}: {e}" for e in contract_schema_errors(contract))
    environment = contract.get("environment")
    if isinstance(environment, dict):
        try:
            if environment.get("env_fingerprint_hash") != hash_value(
                F.env_fingerprint_input(environment), "environment"
            ):
                st.errors.append(
                    f"{F.CONTRACT}: environment.env_fingerprint_hash does not match the "
                    "identity-bearing environment"
                )
        except Fail as exc:
            st.errors.append(f"{F.CONTRACT}: {exc}")
    script = contract.get("replay_script")
    raw_steps = script.get("steps") if isinstance(script, dict) else None
    if not isinstance(raw_steps, list) or not raw_steps:
        st.errors.append(f"{F.CONTRACT}: replay_script.steps is missing or empty")
        return []
    steps: dict[str, dict[str, Any]] = {}
    for index, step in enumerate(raw_steps):
        sid = step.get("step_id") if isinstance(step, dict) else None
        if not isinstance(sid, str) or not sid:
            st.errors.append(f"{F.CONTRACT}: replay_script.steps[{index}] has no step_id")
        elif sid in steps:
            st.errors.append(f"{F.CONTRACT}: duplicate step_id {sid!r}")
        else:
            steps[sid] = step
    deps: dict[str, list[str]] = {}
    for sid, step in steps.items():
        declared = step.get("depends_on")
        if not isinstance(declared, list):
            st.errors.append(f"{F.CONTRACT}: step {sid!r}: depends_on is not a list")
            declared = []
        known = []
        for d in declared:
            if isinstance(d, str) and d in steps:
                known.append(d)
            else:
                st.errors.append(f"{F.CONTRACT}: step {sid!r} depends on unknown step {d!r}")
        deps[sid] = list(dict.fromkeys(known))
    parents = {d for ds in deps.values() for d in ds}
    if not any(steps[s].get("opcode") == "EMIT_OUTPUT" for s in steps if s not in parents):
        st.errors.append(f"{F.CONTRACT}: no terminal EMIT_OUTPUT step")
    order = F.kahn_order(list(steps), deps)
    if order is None:
        st.errors.append(f"{F.CONTRACT}: the step graph has a cycle")
        return []
    return [steps[s] for s in order]
