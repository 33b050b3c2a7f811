"""The plain HTTP endpoints: ``/health``, ``/metrics``, the demo page and its static files.

Handlers are small functions of the ``Gateway`` and the request; aiohttp answers what no route
matches (404, 405 with ``Allow``) and malformed requests (400, 413, 431) itself, in JSON on the
API's paths (``api_errors``).
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.metrics import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["WEB_DEMO_DIR", "api_errors", "error_response", "health", "metrics", "static_file"]

WEB_DEMO_DIR = Path(__file__).resolve().parent.parent / "web_demo"
_NO_CACHE = {"Cache-Control": "no-cache"}


def error_response(status: int, code: str, message: str, *, retryable: bool = False,
                   headers: dict[str, str] | None = None) -> web.Response:
    """An HTTP error as ``{"error": {"code", "message", "retryable"}}``."""
    body: dict[str, Any] = {"error": {"code": code, "message": message, "retryable": retryable}}
    return web.json_response(body, status=status, headers=headers)


_API_PREFIXES = ("/v1/", "/health", "/metrics")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


@web.middleware
async def api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """What aiohttp itself refuses on the API's paths (no such path, a wrong method, a body
    too large) in the JSON endpoints' error form rather than as plain text; the demo page's
    paths and the vendors' (their own form: ``gateway.compat``) are left as they are."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        code = _HTTP_CODES.get(exc.status)
        if code is None or not request.path.startswith(_API_PREFIXES):
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(exc.status, code, f"{request.method} {request.path}: {exc.reason} "
                              "(the API: docs/protocol.md)", headers=headers)


async def health(gateway: Gateway, request: web.Request) -> web.Response:
    status, body = gateway.health()
    return web.json_response(body, status=int(status), headers=_NO_CACHE)


async def metrics(gateway: Gateway, request: web.Request) -> web.Response:
    body = gateway.render_metrics()
    # CONTENT_TYPE_LATEST carries a charset parameter, which ``content_type=`` does not take.
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST, **_NO_CACHE})


async def static_file(request: web.Request) -> web.StreamResponse:
    """``/`` and the demo page's files: one name in ``web_demo/``, no folders, no dot files,
    no Python sources (the folder is a package)."""
    name = request.match_info.get("name") or "index.html"
    if "/" in name or "\\" in name or name.startswith(".") or name.endswith((".py", ".pyc")):
        raise web.HTTPNotFound(text="not found\n")
    file = WEB_DEMO_DIR / name
    if not file.is_file():
        raise web.HTTPNotFound(text="not found\n")
    ctype = "text/javascript" if name.endswith(".js") else (
        mimetypes.guess_type(name)[0] or "application/octet-stream")
    return web.FileResponse(file, headers={"Content-Type": ctype, **_NO_CACHE})
