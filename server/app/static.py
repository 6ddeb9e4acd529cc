"""The browser voice chat page: ``GET /`` and its files under ``/static/`` (docs/browser.md).

Plain files shipped as package data (``server/static/``), no build step.
Only names that exist in that folder are served (no sub-folders, no path
tricks). The page is public like ``/health``: it holds no secret, and the
websocket it opens is checked like any other client.

With ``server.client_dir`` a web client someone built (the ``dist/`` of
Kyutai's Moshi client, as ``moshi.server --static`` serves it) takes ``/``
and every path no kame route answers; kame's page moves to ``/kame``. Served by Starlette's ``StaticFiles`` (no path
outside the folder, symlinks out of it refused, ``.wasm`` as
``application/wasm``).
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter()  # kame's page at /
files_router = APIRouter()  # its files under /static/

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
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


@files_router.api_route("/static/{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    return _file(name)


class ClientDirError(ValueError):
    """``server.client_dir`` does not hold a built web client."""


def check_client_dir(path: Path) -> Path:
    """The folder, resolved, if it holds an ``index.html``; else a one-sentence error."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "index.html").is_file():
        raise ClientDirError(
            f"server.client_dir {path}: no index.html there (give the dist/ folder of a built web client)"
        )
    return folder


#: Where kame's page moves when a client build takes ``/``: a path without a trailing slash, so the
#: page's relative URLs (``static/app.js``, ``v1/realtime``, ``ready``) still resolve from the root.
PAGE_WITH_CLIENT_DIR = "/kame"


def install(app: FastAPI, client_dir: Path | None) -> None:
    """kame's page at ``/``, or the client build in ``client_dir`` there (kame's page then at
    ``/kame``). Call after every other route: the build is mounted at ``/`` and so answers
    whatever they do not."""
    app.include_router(files_router)
    if client_dir is None:
        app.include_router(router)
        return
    folder = check_client_dir(client_dir)
    app.add_api_route(PAGE_WITH_CLIENT_DIR, index, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount("/", StaticFiles(directory=folder, html=True), name="web-client")
