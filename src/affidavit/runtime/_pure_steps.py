"""A pure step: run (retried under the policy), its events written after it returns in one
transaction, so a pure step that did not finish runs again on recovery. A limited pure step (a
model request under a ``Limit``) takes its grant before the call and gives it back after its
record. The executor (:mod:`affidavit.runtime._step_executor`) calls :func:`run_pure`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from affidavit.core import crash
from affidavit.core.plan import external_key
from affidavit.runtime._limits import take_grant
from affidavit.runtime._run_base import (
    Item,
    StepFailed,
    check_result,
    elapsed_ms,
    error_dict,
    recorded,
)
from affidavit.runtime._sdk import ToolContext

if TYPE_CHECKING:
    from affidavit.runtime._step_executor import StepExecutor, StepSpec


def run_pure(
    ex: StepExecutor, spec: StepSpec, args: dict[str, Any], *, prelude: tuple[Item, ...] = ()
) -> Any:
    """Run a pure step (retried under the policy) and return its output as recorded. Its
    events are written after it returns, in one transaction: a pure step that did not
    finish runs again on recovery.

    Raises:
        StepFailed: the step failed for good.
    """
    t = ex.tool_of(spec)
    node_id, step = spec.node_id, spec.step_id
    claim = ex.journal.claim
    attempt = ex.replay.node_attempts.get(node_id, 0)
    limit = t.retry or ex.policy.max_attempts
    ex.wait_out_backoff(node_id)
    while True:
        attempt += 1
        started = {
            "node_id": node_id,
            "step_id": step,
            "attempt": attempt,
            "worker_id": claim.worker_id,
        }
        ctx = ToolContext(
            claim.job_id,
            node_id,
            step,
            attempt,
            None,
            external_key(claim.job_id, step, claim.attempt_id),
        )
        ctx.close(f"pure step {node_id!r} changes nothing outside")
        grant = take_grant(ex.journal, ex.control, t.name, t.limit) if t.limit else None
        t0 = time.perf_counter()
        try:
            output = ex.call(spec, t.fn, ctx, args, prelude)
            output_jcs = check_result(node_id, t, output)
        except Exception as exc:
            prelude = ex.unwritten(ctx, prelude)
            retry = ex.retryable(t, exc) and attempt < limit
            finished: dict[str, Any] = {
                "node_id": node_id,
                "step_id": step,
                "attempt": attempt,
                "result_type": "retryable_failure" if ex.retryable(t, exc) else "permanent_failure",
                "error": error_dict(exc),
                "duration_ms": elapsed_ms(t0),
                **({"usage": ctx.usage} if ctx.usage else {}),
                **({"limit_grant": grant.record()} if grant else {}),
            }
            ex.count_usage(ctx)
            ex.journal.write(
                *prelude, ("node_started", started), ("node_finished", finished), fast=True
            )
            ex.give_back(grant)
            prelude = ()
            if retry:
                ex.backoff(attempt)
                continue
            raise StepFailed(node_id, error_dict(exc)) from exc
        prelude = ex.unwritten(ctx, prelude)
        crash.crash_point("pure.after_execute")
        finished = {
            "node_id": node_id,
            "step_id": step,
            "attempt": attempt,
            "result_type": "pure",
            "output": orjson.Fragment(output_jcs),
            "duration_ms": elapsed_ms(t0),
            **({"usage": ctx.usage} if ctx.usage else {}),
            **({"limit_grant": grant.record()} if grant else {}),
        }
        ex.count_usage(ctx)
        ex.journal.write(
            *prelude, ("node_started", started), ("node_finished", finished), fast=True
        )
        ex.give_back(grant)
        return recorded(output_jcs)
