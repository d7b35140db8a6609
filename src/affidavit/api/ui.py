"""The trace page: ``/ui/`` (jobs) and ``/ui/jobs/{id}`` (one job), static files served by the
app itself (no CDN). The page is a shell; its data comes from the JSON API with the key the
user enters once (kept in the browser tab's session storage)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from affidavit.core.errors import ConfigError

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


# Swagger UI's files as the fastapi-offline package ships them (a dependency for just this):
# /docs works with no network, as the trace page does.
DOCS_STATIC = "/docs/static"


@router.get("/docs")
def docs() -> HTMLResponse:
    """Swagger UI for ``/openapi.json``, its script and style served from ``/docs/static``."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="affidavit API",
        swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
        swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_STATIC}/favicon.png",
    )


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.mount(DOCS_STATIC, StaticFiles(directory=_swagger_files()), name="docs-static")


def _swagger_files() -> Path:
    """The directory of Swagger UI's files in the fastapi-offline package (found without
    importing it: its module builds an app class we do not use)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the fastapi-offline package (Swagger UI's files for /docs) is not installed",
            hint="Reinstall affidavit: pip install affidavit.",
        )
    return Path(spec.origin).with_name("static")
