"""The trace page: ``/ui/`` (jobs) and ``/ui/jobs/{id}`` (one job), static files served by the
app itself (no CDN). The page is a shell; its data comes from the JSON API with the key the
user enters once (kept in the browser tab's session storage)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).with_name("static")
router = APIRouter(include_in_schema=False)


def _page() -> HTMLResponse:
    return HTMLResponse(
        (STATIC / "page.html").read_text(encoding="utf-8"),
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; frame-ancestors 'none'",
        },
    )


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/ui/")
def jobs_page() -> HTMLResponse:
    return _page()


@router.get("/ui/jobs/{job_id}")
def job_page(job_id: str) -> HTMLResponse:
    return _page()


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
