"""Confirmation replay (G4): before a recorded side effect is trusted again, ask the world.

When a worker picks up a job that already committed tool steps, every
:class:`ResourceVerifier` registered for a resource type that such a step recorded in
``state_changed`` is asked whether the resource still is as the step left it. The job's
``replay_verification`` mode decides what a mismatch does:

- ``strict`` (default): the job fails (``job_failed``, error type ``replay_verification``);
- ``warn``: a ``confirmation_warning`` event per mismatch, a counter, and the job goes on;
- ``human``: the job parks (``job_parked``, reason ``replay_verification``) until a person runs
  ``affidavit resume JOB --decision continue|fail``; ``continue`` accepts the mismatched steps
  for the rest of the job.

A verifier that raises is a mismatch (it could not confirm): confirmation fails closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from affidavit.runtime._sdk import StateChange

REPLAY_VERIFICATION_MODES = ("strict", "warn", "human")


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A verifier's answer: the resource matches the record, or not (and why)."""

    ok: bool
    reason: str = ""
    observed: str | int | None = None  # what the verifier found, when it read a version

    @classmethod
    def match(cls) -> Confirmation:
        return cls(True)

    @classmethod
    def mismatch(cls, reason: str, *, observed: Any = None) -> Confirmation:
        """A mismatch; ``observed``: the version (ETag, field value) the resource has now, as
        the record's ``version`` / ``etag`` would name it (shown next to the recorded one)."""
        if observed is not None and (type(observed) is not int and type(observed) is not str):
            observed = repr(observed)
        return cls(False, reason, observed)


@dataclass(frozen=True, slots=True)
class ConfirmationContext:
    """The committed step whose recorded change is being confirmed."""

    job_id: str
    node_id: str
    step_id: str
    idempotency_key: str | None
    result: Any


@runtime_checkable
class ResourceVerifier(Protocol):
    """Checks that an outside resource still is as a committed step recorded it.

    ``resource_types`` names the ``state_changed`` resource types it answers for;
    ``verify`` must not change the world and should be quick (it runs on every pickup).
    """

    resource_types: tuple[str, ...]

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation: ...


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One recorded change the world no longer matches."""

    node_id: str
    step_id: str
    resource: dict[str, Any]
    reason: str
    verifier: str
    observed: str | int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "step_id": self.step_id,
            "resource": self.resource,
            "reason": self.reason,
            "verifier": self.verifier,
        }
        if self.observed is not None:  # (absent when the verifier read no version)
            out["observed"] = self.observed
        return out


def confirm_changes(
    verifiers: Mapping[str, list[ResourceVerifier]],
    ctx: ConfirmationContext,
    changes: Iterable[Mapping[str, Any]],
) -> list[Mismatch]:
    """Ask every verifier registered for each change's resource type; return the mismatches
    (empty when the world matches or no verifier answers for the types recorded)."""
    found: list[Mismatch] = []
    for raw in changes:
        change = StateChange.from_dict(raw)
        for verifier in verifiers.get(change.resource_type, ()):
            name = type(verifier).__name__
            try:
                answer = verifier.verify(ctx, change)
            except Exception as exc:  # could not confirm: fail closed
                answer = Confirmation.mismatch(f"{name} could not check: {exc!r}")
            if not answer.ok:
                found.append(
                    Mismatch(
                        ctx.node_id,
                        ctx.step_id,
                        change.to_dict(),
                        answer.reason,
                        name,
                        answer.observed,
                    )
                )
    return found
