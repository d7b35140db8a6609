"""The job's record as data: reading a job's log (the replay context), the trace model of plan
and agent jobs, the seal a finished job gets, the context a person decides a parked job in, and
the resolution of a step's arguments from what the log recorded.

It imports only :mod:`affidavit.core` and :mod:`affidavit.store`: the runtime writes the record
through it, and the faces, Verification Mode's repairs, the transparency log and the proof packs
read it here without loading the engine. (Verification Mode's proofs read the log on their own:
see :mod:`affidavit.verify._fold`.)

Each name is imported on first use, so that reading a trace does not load the sealing keys'
cryptography and the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.record._agent_trace import AgentOutcome, agent_trace_of, is_agent_log
    from affidavit.record._args import ArgsResolutionError, check_input_references, resolve
    from affidavit.record._decision_context import decision_context
    from affidavit.record._follow import JobFollower, follow_job, next_wait
    from affidavit.record._job_doc import (
        MAX_LISTED_CHILDREN,
        family_doc,
        fork_lineage,
        seal_document,
    )
    from affidavit.record._opened import SubjectView, opened_payload, shown_job
    from affidavit.record._recovered import recovered_steps, recovery_text
    from affidavit.record._replay import (
        Invocation,
        ReplayContext,
        ReplayContextBuilder,
        build_from_events,
    )
    from affidavit.record._sealing import (
        Sealer,
        SealKeyRefused,
        default_key_path,
        key_status,
        trust_key,
    )
    from affidavit.record._states import (
        COMPLETED_STATES,
        NODE_STATE_KIND_NAMES,
        NODE_STATE_KINDS,
        NODE_STATES,
        NodeFacts,
        node_state,
    )
    from affidavit.record._trace import job_input, job_trace, park_doc, trace_of

_LAZY = {
    "AgentOutcome": "affidavit.record._agent_trace",
    "agent_trace_of": "affidavit.record._agent_trace",
    "is_agent_log": "affidavit.record._agent_trace",
    "ArgsResolutionError": "affidavit.record._args",
    "check_input_references": "affidavit.record._args",
    "resolve": "affidavit.record._args",
    "decision_context": "affidavit.record._decision_context",
    "JobFollower": "affidavit.record._follow",
    "follow_job": "affidavit.record._follow",
    "next_wait": "affidavit.record._follow",
    "MAX_LISTED_CHILDREN": "affidavit.record._job_doc",
    "family_doc": "affidavit.record._job_doc",
    "fork_lineage": "affidavit.record._job_doc",
    "seal_document": "affidavit.record._job_doc",
    "Invocation": "affidavit.record._replay",
    "ReplayContext": "affidavit.record._replay",
    "ReplayContextBuilder": "affidavit.record._replay",
    "build_from_events": "affidavit.record._replay",
    "opened_payload": "affidavit.record._opened",
    "SubjectView": "affidavit.record._opened",
    "shown_job": "affidavit.record._opened",
    "recovered_steps": "affidavit.record._recovered",
    "recovery_text": "affidavit.record._recovered",
    "SealKeyRefused": "affidavit.record._sealing",
    "Sealer": "affidavit.record._sealing",
    "default_key_path": "affidavit.record._sealing",
    "key_status": "affidavit.record._sealing",
    "trust_key": "affidavit.record._sealing",
    "COMPLETED_STATES": "affidavit.record._states",
    "NODE_STATE_KIND_NAMES": "affidavit.record._states",
    "NODE_STATE_KINDS": "affidavit.record._states",
    "NODE_STATES": "affidavit.record._states",
    "NodeFacts": "affidavit.record._states",
    "node_state": "affidavit.record._states",
    "job_input": "affidavit.record._trace",
    "job_trace": "affidavit.record._trace",
    "park_doc": "affidavit.record._trace",
    "trace_of": "affidavit.record._trace",
}

__getattr__ = lazy_exports("affidavit.record", _LAZY, globals())

__all__ = [
    "COMPLETED_STATES",
    "MAX_LISTED_CHILDREN",
    "NODE_STATES",
    "NODE_STATE_KINDS",
    "NODE_STATE_KIND_NAMES",
    "AgentOutcome",
    "ArgsResolutionError",
    "Invocation",
    "JobFollower",
    "NodeFacts",
    "ReplayContext",
    "ReplayContextBuilder",
    "SealKeyRefused",
    "Sealer",
    "SubjectView",
    "agent_trace_of",
    "build_from_events",
    "check_input_references",
    "decision_context",
    "default_key_path",
    "family_doc",
    "follow_job",
    "fork_lineage",
    "is_agent_log",
    "job_input",
    "job_trace",
    "key_status",
    "next_wait",
    "node_state",
    "opened_payload",
    "park_doc",
    "recovered_steps",
    "recovery_text",
    "resolve",
    "seal_document",
    "shown_job",
    "trace_of",
    "trust_key",
]
