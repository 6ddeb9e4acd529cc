"""The browser voice chat page: ``GET /`` and its files under ``/static/`` (docs/browser.md).

Plain files shipped as package data (``server/static/``), no build step.
Only names that exist in that folder are served (no sub-folders, no path
tricks). The page is public like ``/health``: it holds no secret, and the
websocket it opens is checked like any other client.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

router = APIRouter()

STATIC_DIR = Path(__file__).resolve().parent / "static"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\.(html|js|css|svg)$")
_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",  # module scripts and AudioWorklets need a JS type
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
# Same-origin everything: the page loads nothing from elsewhere and talks only to this server.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; media-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "Permissions-Policy": "microphone=(self)",
}


def _file(name: str) -> FileResponse:
    m = _NAME.match(name)
    path = STATIC_DIR / name
    if m is None or not path.is_file():
        raise HTTPException(404, "not found")
    return FileResponse(path, media_type=_TYPES[m.group(1)], headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index() -> FileResponse:
    return _file("index.html")


@router.api_route("/static/{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    return _file(name)
