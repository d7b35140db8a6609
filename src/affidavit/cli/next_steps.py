"""What moves a waiting or parked job on: the waits and the park `jobs show` lists, and the
commands that answer them (`affidavit signal`, `affidavit resume`) — printed by every command
that leaves a job there (`jobs show`, `run`, `jobs wait`, `signal`, `resume`)."""

from __future__ import annotations

import time
from typing import Any

from affidavit.core.parks import DECISIONS_BY_REASON
from affidavit.store import JobRecord, Store


def decisions_doc(store: Store, job: JobRecord) -> dict[str, Any]:
    """``{"waiting_for": [{"node_id", "wait_type", "correlation_key"}]}`` for a waiting job,
    ``{"parked": {...}}`` for a parked one (see :func:`~affidavit.record.park_doc`),
    ``{"waiting_for_limit": {"limit", "since", "reason"}}`` for a running one whose call waits
    for a limit's grant (not in the log: store/limit_waits.py), ``{}`` otherwise — read from
    the job's log."""
    if job.status == "running":
        from affidavit.store.limit_waits import waiting_for_limit

        wait = waiting_for_limit(store, job.job_id, now_s=time.time())
        return {} if wait is None else {"waiting_for_limit": wait}
    if job.status not in ("waiting", "parked"):
        return {}
    from affidavit.record import SubjectView, build_from_events, park_doc  # (on use)

    # a subject's values (an approval's arguments, a park's detail): opened, or shown erased
    view = SubjectView(store, job.job_id)
    replay = build_from_events(view.events(store.list_events(job.job_id)))
    if job.status == "waiting":
        return {
            "waiting_for": [
                {"node_id": w["node_id"], "wait_type": w["wait_type"], "correlation_key": k}
                for k, w in replay.waits.items()
                if k not in replay.completed_waits
            ]
        }
    parked = park_doc(replay)
    return {} if parked is None else {"parked": parked}


# What a pending job needs: nothing runs in the command that made it runnable (a signal, a
# resume, a submit); a worker must claim it.
_CLAIM = (
    "next: the job is pending until a worker claims it — run one with `affidavit worker "
    "--tools MODULE` (the module that registers its tools or agent; --until-idle to stop when "
    "nothing is left), then `affidavit jobs wait {job_id}` to follow it"
)


def next_steps(doc: dict[str, Any]) -> list[str]:
    """The commands that move a waiting or parked job on (``doc``: the job's ``job_id`` with
    what :func:`decisions_doc` gives); for a call waiting for a limit, what it waits for; for
    a pending job (``doc["status"]``), that a worker must claim it, and how."""
    job_id = doc["job_id"]
    if doc.get("status") == "pending":
        return [_CLAIM.format(job_id=job_id)]
    limit_wait = doc.get("waiting_for_limit")
    if isinstance(limit_wait, dict):  # (no command moves it on: a grant will)
        return [
            f"waiting for limit {limit_wait['limit']} since {limit_wait['since']} "
            f"({limit_wait['reason']})"
        ]
    if doc.get("waiting_for"):
        return [
            f"next: affidavit signal {job_id} --key {w['correlation_key']} "
            + (
                "--payload '{\"approved\": true|false}' --as NAME"
                if w["wait_type"] == "approval"
                else "[--payload JSON]"
            )
            + f"   ({w['wait_type']} {_step_name(w)})"
            for w in doc["waiting_for"]
        ]
    park = doc.get("parked")
    if not isinstance(park, dict):
        return []
    reason = park.get("reason")
    decisions = "|".join(DECISIONS_BY_REASON.get(str(reason), ("fail",)))
    line = f"next: affidavit resume {job_id} --park {park['version']} --decision {decisions}"
    if reason == "in_flight":
        detail = park.get("detail")  # (a subject's, once erased: not a mapping)
        tool = (detail.get("tool_name") if isinstance(detail, dict) else None) or "the tool"
        line += (
            f"   (did {tool} act? accept_result --result JSON with what it returned if it did, "
            "retry if it did not)"
        )
    return [line]


def _step_name(wait: dict[str, Any]) -> str:
    """An open wait's step as people know it: an agent step by its key (``big_refund``, step
    ``#2``), a plan node by its id."""
    node_id = str(wait["node_id"])
    if node_id.startswith("#"):  # (an agent step: its key is what the code named it)
        return f"{wait['correlation_key']} (step {node_id})"
    return f"of node {node_id}"
