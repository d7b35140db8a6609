"""``/api/queues``: the queues with limits, as `affidavit queues list` shows them (see
docs/queues.md)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from affidavit.api.deps import Observer, ServiceDep
from affidavit.api.models import ErrorBody
from affidavit.store.queues import list_queues, queue_stats

router = APIRouter(
    prefix="/api/queues",
    tags=["queues"],
    responses={code: {"model": ErrorBody} for code in (401, 429, 503)},
)


class QueueState(BaseModel):
    name: str
    concurrency: int | None = Field(description="Jobs running at once, across workers.")
    worker_concurrency: int | None = Field(description="Jobs running at once per worker.")
    rate: str | None = Field(description="Job starts in any sliding window: N/PERIOD.")
    priority: bool
    partitioned: bool
    pending: int
    running: int
    waiting: int
    started_in_period: int = Field(description="Starts in the last period_seconds.")
    period_seconds: float


class QueueList(BaseModel):
    queues: list[QueueState]


@router.get("", response_model=QueueList)
def queues(svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """Every queue: its configuration, pending, running and waiting jobs, and its starts in
    the last period (the rate's, else a minute)."""
    now = time.time()
    return {"queues": [queue_stats(svc.store, c, now) for c in list_queues(svc.store)]}
