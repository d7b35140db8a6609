"""The FastAPI application: ``create_app(store)``, served by ``affidavit serve``.

The app has no logic of its own: each route authenticates the caller, checks role and namespace,
and calls the service function the CLI calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from affidavit.api import claims, decisions, errors, jobs, keys, queues, subjects, ui
from affidavit.api import log as log_api
from affidavit.api import stream as stream_api
from affidavit.api.deps import Admin, Service, ServiceDep, unique_json_keys
from affidavit.api.models import ErrorBody, Health
from affidavit.claims.sandbox import SandboxConfig
from affidavit.core.errors import StoreError
from affidavit.faces.limits import (
    DEFAULT_MAX_BODY,
    BodyGuard,
    ClaimLimits,
    ClaimSlots,
    StreamSlots,
)
from affidavit.faces.ratelimit import DEFAULT_RATE_LIMIT, Limiter, RateLimit
from affidavit.faces.sealed_cache import DEFAULT_SEALED_CACHE_BYTES, SealedCache
from affidavit.runtime import ToolRegistry
from affidavit.store import JOB_STATUSES, Store

HEALTH_TIMEOUT_S = 5.0


class _StoreCollector(Collector):
    """Counts read from the database at scrape time (every worker's work, not just ours)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        jobs_by_status = GaugeMetricFamily("affidavit_jobs", "Jobs by status.", labels=["status"])
        counts = self.store.count_jobs_by_status()
        for status in JOB_STATUSES:
            jobs_by_status.add_metric([status], counts.get(status, 0))
        yield jobs_by_status
        ledger = GaugeMetricFamily(
            "affidavit_tool_invocations",
            "Ledger rows (tool invocations) by status: started (in flight), committed, failed.",
            labels=["status"],
        )
        for status, n in sorted(self.store.count_invocations_by_status().items()):
            ledger.add_metric([status], n)
        yield ledger
        claims = GaugeMetricFamily(
            "affidavit_claim_verifications",
            "Claim verifications by claim type and verdict (accurate, inaccurate, error).",
            labels=["claim_type", "verdict"],
        )
        for (claim_type, verdict), n in sorted(self.store.count_claim_verdicts().items()):
            claims.add_metric([claim_type, verdict], n)
        yield claims


def create_app(
    store: Store,
    *,
    tools: ToolRegistry | None = None,
    rate_limit: RateLimit | None = DEFAULT_RATE_LIMIT,
    claims_sandbox: SandboxConfig | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    claim_limits: ClaimLimits | None = None,
    stream_slots: StreamSlots | None = None,
    sealed_cache_bytes: int = DEFAULT_SEALED_CACHE_BYTES,
) -> FastAPI:
    """The API over ``store``. ``tools``: check submitted plans against these registered tools
    (``None``: workers check them when they run the job). ``rate_limit``: per API key
    (``None``: unlimited). ``claims_sandbox``: how claim commands run (``None``: the default,
    in bubblewrap; without it claims are refused). ``max_body_bytes``: the largest request body
    (413 beyond). ``claim_limits``: claims running at once, in all and per agent, and their
    longest timeout (docs/api.md, limits). ``stream_slots``: live streams open at once, how
    long each, how often a heartbeat (docs/api.md, streams). ``sealed_cache_bytes``: the memory
    the traces, verifications and packs of sealed jobs may keep (``0``: computed every time;
    docs/api.md, sealed jobs)."""
    from affidavit import __version__  # the package root, imported late (it imports every layer)

    app = FastAPI(
        title="affidavit",
        version=__version__,
        description="Durable AI-agent jobs with at-most-once side effects and verifiable "
        "records. Authenticate with `Authorization: Bearer <key>` (`affidavit apikeys create`).",
        dependencies=[Depends(unique_json_keys)],
        docs_url=None,  # served by ui.install from local files: FastAPI's page loads a CDN
    )
    app.state.service = Service(
        store,
        tools,
        Limiter(rate_limit) if rate_limit else None,
        claims_sandbox,
        ClaimSlots(claim_limits or ClaimLimits()),
        stream_slots or StreamSlots(),
        SealedCache(sealed_cache_bytes),
    )
    registry = _metrics_registry(store)
    app.state.metrics = registry
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(stream_api.router)
    app.include_router(decisions.router)
    app.include_router(claims.router)
    app.include_router(keys.router)
    app.include_router(queues.router)
    app.include_router(log_api.router)
    app.include_router(subjects.router)
    ui.install(app)
    _install_timing(app, registry)
    # Outermost: authenticate and cap a body before anything reads it.
    app.add_middleware(BodyGuard, store=store, max_body=max_body_bytes)
    _install_service_routes(app, registry)
    return app


def _metrics_registry(store: Store) -> CollectorRegistry:
    """The registry ``/metrics`` serves: the store's counts, read at scrape time."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_StoreCollector(store))
    return registry


class _Timing:
    """ASGI middleware: each request's latency into ``latency`` by route, method and status.
    (Plain ASGI, not ``@app.middleware("http")``, which copies every response through a stream
    of its own: a millisecond of every request's CPU.)"""

    def __init__(self, app: ASGIApp, *, latency: Histogram) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500  # (what the client gets when the app raises)

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")  # (set by the router)
            self.latency.labels(path, scope["method"], str(status)).observe(
                time.perf_counter() - t0
            )


def _install_timing(app: FastAPI, registry: CollectorRegistry) -> None:
    """Time every request into a latency histogram (by route, method and status) in
    ``registry``."""
    latency = Histogram(
        "affidavit_http_request_duration_seconds",
        "HTTP request latency by route, method and status.",
        ["route", "method", "status"],
        registry=registry,
    )
    app.add_middleware(_Timing, latency=latency)


def _install_service_routes(app: FastAPI, registry: CollectorRegistry) -> None:
    """``/health`` (no key) and ``/metrics`` (admin keys: ``registry`` as Prometheus text)."""
    # /health answers on threads of its own: never behind requests that hold the others.
    health_threads = anyio.CapacityLimiter(2)

    @app.get(
        "/health",
        response_model=Health,
        tags=["service"],
        responses={503: {"model": Health}},
    )
    async def health(svc: ServiceDep) -> JSONResponse:
        """Is the database reachable? No key needed; answers within a few seconds whatever
        else the server is doing."""
        try:
            with anyio.fail_after(HEALTH_TIMEOUT_S):
                await anyio.to_thread.run_sync(
                    svc.store.schema_version, limiter=health_threads, abandon_on_cancel=True
                )
        except TimeoutError:
            return JSONResponse(
                {
                    "status": "unavailable",
                    "database": f"no answer within {HEALTH_TIMEOUT_S:g} s",
                    "backend": svc.store.backend,
                },
                status_code=503,
            )
        except StoreError as exc:
            return JSONResponse(
                {"status": "unavailable", "database": exc.message, "backend": svc.store.backend},
                status_code=503,
            )
        return JSONResponse({"status": "ok", "database": "ok", "backend": svc.store.backend})

    @app.get(
        "/metrics",
        tags=["service"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}},
            401: {"model": ErrorBody},
            403: {"model": ErrorBody},
        },
    )
    def metrics(caller: Admin) -> Response:
        """Prometheus text: jobs by status, ledger rows by status, request latencies. Counts of
        every namespace: admin keys only."""
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")
