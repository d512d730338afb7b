"""Plain HTTP on the WebSocket port: /health (+ /health/live, /health/ready), /v1/models, /metrics, the demo.

`HttpRoutes.respond(request)` returns a websockets `Response` for these paths (GET and HEAD;
HEAD carries the same headers, no body) or `None` to let the request continue as a WebSocket
upgrade (only `/v1/realtime`). Static files are served from fixed roots, traversal-safe.
"""

from __future__ import annotations

import asyncio
import http
import json
import mimetypes
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .metrics import CONTENT_TYPE_LATEST, ServerMetrics

__all__ = ["REALTIME_PATH", "HttpRoutes", "default_web_roots", "json_response", "text_response"]

REALTIME_PATH = "/v1/realtime"
HEALTH_PROBES = {"/health": "health", "/health/live": "live", "/health/ready": "ready"}  # path -> probe name

# Explicit types for what the demo ships; mimetypes covers the rest.
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".wasm": "application/wasm",
    ".webmanifest": "application/manifest+json",
    ".wav": "audio/wav",
    ".txt": "text/plain; charset=utf-8",
}


def default_web_roots(configured: str | None) -> list[Path]:
    """Static roots in order: the configured folder, else the repo's web/, then the package copy."""
    if configured is not None:
        return [Path(configured)]
    package = Path(__file__).resolve().parent.parent
    return [package.parent / "web", package / "web"]


def _response(status: http.HTTPStatus, body: bytes, content_type: str, *, head: bool = False) -> Response:
    headers = Headers()
    headers["Content-Type"] = content_type
    headers["Content-Length"] = str(len(body))
    headers["Cache-Control"] = "no-cache"
    return Response(status.value, status.phrase, headers, b"" if head else body)


def json_response(status: http.HTTPStatus, payload: Any, *, head: bool = False) -> Response:
    """A JSON response (`application/json`)."""
    return _response(status, json.dumps(payload).encode(), "application/json", head=head)


def text_response(status: http.HTTPStatus, text: str, *, head: bool = False) -> Response:
    """A plain-text response."""
    return _response(status, text.encode(), "text/plain; charset=utf-8", head=head)


class HttpRoutes:
    """Route table of the plain-HTTP side. `health` and `models` are callables evaluated per request;
    `health(probe)` ("health", "live" or "ready") returns the status code and the JSON body."""

    def __init__(
        self,
        *,
        metrics: ServerMetrics,
        health: Callable[[str], tuple[http.HTTPStatus, dict]],
        models: Callable[[], dict],
        web_roots: list[Path],
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._models = models
        self._web_roots = [root.resolve() for root in web_roots if root.is_dir()]

    async def respond(self, request: Request) -> Response | None:
        """The HTTP response for `request`, or None when it should upgrade to WebSocket (cancel-safe)."""
        path = urlsplit(request.path).path
        if path == REALTIME_PATH:
            return None
        if request.method not in ("GET", "HEAD"):
            return text_response(http.HTTPStatus.METHOD_NOT_ALLOWED, "Only GET and HEAD are served.\n")
        head = request.method == "HEAD"
        probe = HEALTH_PROBES.get(path)
        if probe is not None:
            status, payload = self._health(probe)
            return json_response(status, payload, head=head)
        if path == "/v1/models":
            return json_response(http.HTTPStatus.OK, self._models(), head=head)
        if path == "/metrics":
            return _response(http.HTTPStatus.OK, self._metrics.render(), CONTENT_TYPE_LATEST, head=head)
        return await self._static(path, head)

    async def _static(self, path: str, head: bool) -> Response:
        file = self._find(path)
        if file is None:
            return text_response(http.HTTPStatus.NOT_FOUND, "Not found.\n", head=head)
        content_type = _CONTENT_TYPES.get(file.suffix.lower()) or (
            mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        )
        body = await asyncio.to_thread(file.read_bytes)  # file reads stay off the event loop
        return _response(http.HTTPStatus.OK, body, content_type, head=head)

    def _find(self, path: str) -> Path | None:
        """The file under a web root for URL `path`; None for traversal attempts or misses."""
        relative = PurePosixPath(unquote(path)).relative_to("/") if path.startswith("/") else None
        if relative is None or any(part in ("..", "") or "\\" in part or "\0" in part for part in relative.parts):
            return None
        for root in self._web_roots:
            candidate = (root / relative).resolve()
            if candidate.is_dir():
                candidate = candidate / "index.html"
            if candidate.is_file() and candidate.is_relative_to(root):
                return candidate
        return None
