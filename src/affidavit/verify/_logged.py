"""The job's seal against the transparency log, where the store has one: one leaf per job,
and the first one wins.

Once a job's seal is logged, the log is the witness of which seal the job had first: the store
refuses to change a logged seal or to log a second leaf for a job (migration 13), and this check
catches a database where those guards were dropped. It reads the job's first two leaves (in
the verification's snapshot) and reports, by code:

- ``seal_superseded``: the job's current seal is not its first logged leaf (the seal was
  replaced, or deleted, after it was logged);
- ``log_duplicate``: the log holds more than one leaf for the job.

A job with no leaf (not logged yet, or a store without a log) is not checked here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from affidavit.core.seal import Seal, log_leaf
from affidavit.store import LogLeaf
from affidavit.verify.result import VerificationResult

SEAL_SUPERSEDED = "seal_superseded"
LOG_DUPLICATE = "log_duplicate"
LEAVES_READ = 2  # the first leaf, and whether there is another


def log_problems(seal: Seal | None, leaves: Sequence[LogLeaf]) -> list[tuple[str, str]]:
    """``(code, message)`` of each way the job's seal disagrees with its logged leaves
    (``leaves``: its first ones, in index order)."""
    if not leaves:
        return []
    first = leaves[0]
    found: list[tuple[str, str]] = []
    if seal is None:
        found.append((
            SEAL_SUPERSEDED,
            f"the job has no seal, but its seal is leaf {first.index} of the transparency log "
            "(deleted after it was logged)",
        ))  # fmt: skip
    elif log_leaf(seal) != first.leaf:
        found.append((
            SEAL_SUPERSEDED,
            f"the job's seal is not its first leaf in the transparency log (leaf "
            f"{first.index}): it was replaced after it was logged",
        ))  # fmt: skip
    if len(leaves) > 1:
        found.append((
            LOG_DUPLICATE,
            f"the transparency log holds more than one leaf for the job (leaves {first.index} "
            f"and {leaves[1].index})",
        ))  # fmt: skip
    return found


def with_log_check(
    result: VerificationResult, seal: Seal | None, leaves: Sequence[LogLeaf]
) -> VerificationResult:
    """``result`` with the seal check failed by each problem :func:`log_problems` finds (its
    code in ``seal.codes``, its message in ``seal.error``)."""
    problems = log_problems(seal, leaves)
    if not problems:
        return result
    messages = [f"{code}: {message}" for code, message in problems]
    error = "; ".join([result.seal.error, *messages] if result.seal.error else messages)
    codes = tuple(dict.fromkeys([*result.seal.codes, *(code for code, _ in problems)]))
    return replace(result, seal=replace(result.seal, ok=False, codes=codes, error=error))
