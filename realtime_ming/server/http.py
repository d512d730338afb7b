"""Plain HTTP on the WebSocket port: /health (+ /health/live, /health/ready), /v1/models, /metrics, the demo.

`HttpRoutes.respond(request)` returns a websockets `Response` for these paths (GET and HEAD;
HEAD carries the same headers, no body) or `None` to let the request continue as a WebSocket
upgrade (only `/v1/realtime`). Static files are served from fixed roots, traversal-safe: the
request target is split into segments before percent-decoding, and every odd target (encoded
slashes, NUL, bad percent-encoding, over-long names or paths) is a 4xx, never a file-system error.
The demo ships inside the package (`realtime_ming/web/`), so editable and wheel installs serve it.
"""

from __future__ import annotations

import asyncio
import http
import importlib.resources
import json
import logging
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .metrics import CONTENT_TYPE_LATEST, ServerMetrics

__all__ = ["REALTIME_PATH", "ApiRefusal", "HttpRoutes", "answer_api", "api_error", "default_web_roots", "json_response", "packaged_web_root",
           "request_path", "text_response"]

log = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
MAX_TARGET_CHARS = 2048  # longer request targets get 414 (websockets itself cuts the request line at 8 KiB)
MAX_SEGMENTS = 32  # deeper static paths cannot exist in the demo: 404 without touching the disk
MAX_SEGMENT_BYTES = 255  # NAME_MAX of common file systems
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


def packaged_web_root() -> Path | None:
    """The browser demo shipped in the package (`realtime_ming/web/`), or None when it is missing."""
    root = importlib.resources.files("realtime_ming") / "web"
    # A package installed as plain files yields a real Path; a zipped install cannot serve files.
    if isinstance(root, Path) and (root / "index.html").is_file():
        return root
    return None


def default_web_roots(configured: str | None) -> list[Path]:
    """Static roots: the configured folder (`server.web_dir`), else the package's demo (if present)."""
    if configured is not None:
        return [Path(configured)]
    root = packaged_web_root()
    return [] if root is None else [root]


def request_path(target: str) -> str:
    """The path part of a request target (no query, no fragment); never raises."""
    return target.partition("?")[0].partition("#")[0]


def _response(status: http.HTTPStatus, body: bytes, content_type: str, *, head: bool = False) -> Response:
    headers = Headers()
    headers["Content-Type"] = content_type
    headers["Content-Length"] = str(len(body))
    headers["Cache-Control"] = "no-cache"
    return Response(status.value, status.phrase, headers, b"" if head else body)


def json_response(status: http.HTTPStatus, payload: Any, *, head: bool = False) -> Response:
    """A JSON response (`application/json`)."""
    return _response(status, json.dumps(payload).encode(), "application/json", head=head)


def api_error(status: int, code: str, message: str, param: str | None = None) -> Response:
    """An OpenAI-style JSON error: `{"error": {"type", "code", "message", "param"}}` (type from the status)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"type": kind, "code": code, "message": message, "param": param}}
    return json_response(http.HTTPStatus(status), body)


class ApiRefusal(Exception):
    """An API request refused: carries its OpenAI-style error response (`api_error`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.response = api_error(status, code, message, param)


async def answer_api(handling: Awaitable[Response], failure: str) -> Response:
    """The response of an API handler: its own, its `ApiRefusal`'s, or a 500 saying `failure` when it has a bug
    (logged; it costs this request only)."""
    try:
        return await handling
    except ApiRefusal as refusal:
        return refusal.response
    except Exception:
        log.exception("%s", failure)
        return api_error(500, "server_error", failure)


def text_response(status: http.HTTPStatus, text: str, *, head: bool = False) -> Response:
    """A plain-text response."""
    return _response(status, text.encode(), "text/plain; charset=utf-8", head=head)


class _BadTarget(Exception):
    """A request target that names no file: carries the 4xx status and its text."""

    def __init__(self, status: http.HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


_NOT_FOUND = (http.HTTPStatus.NOT_FOUND, "Not found.\n")
_HEX = frozenset("0123456789abcdefABCDEF")


def _segments(path: str) -> list[str]:
    """The decoded segments of an origin-form `path`; raises _BadTarget (400/404) for odd ones.

    Splitting happens before percent-decoding, so `%2f` cannot introduce a separator; a trailing
    `/` yields a final empty segment (the folder's index.html).
    """
    if not path.startswith("/"):
        raise _BadTarget(http.HTTPStatus.BAD_REQUEST, "The request target must be a path starting with '/'.\n")
    raw = path[1:].split("/")
    if len(raw) > MAX_SEGMENTS:
        raise _BadTarget(*_NOT_FOUND)
    segments = []
    for i, part in enumerate(raw):
        at = part.find("%")
        while at != -1:
            if len(part) < at + 3 or part[at + 1] not in _HEX or part[at + 2] not in _HEX:
                raise _BadTarget(http.HTTPStatus.BAD_REQUEST, "Malformed percent-encoding in the path.\n")
            at = part.find("%", at + 3)
        decoded = unquote_to_bytes(part)
        if len(decoded) > MAX_SEGMENT_BYTES:
            raise _BadTarget(*_NOT_FOUND)
        try:
            name = decoded.decode("utf-8")
        except UnicodeDecodeError:
            raise _BadTarget(http.HTTPStatus.BAD_REQUEST, "The path is not UTF-8.\n") from None
        if any(ord(c) < 0x20 or c == "\x7f" for c in name):
            raise _BadTarget(http.HTTPStatus.BAD_REQUEST, "Control characters in the path.\n")
        last = i == len(raw) - 1
        if name in (".", "..") or "/" in name or "\\" in name or (name == "" and not last):
            raise _BadTarget(*_NOT_FOUND)
        segments.append(name)
    return segments


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
        if not any((root / "index.html").is_file() for root in self._web_roots):
            looked = ", ".join(str(root) for root in web_roots) or "the installed package (realtime_ming/web)"
            log.warning("browser demo not found (looked in %s): GET / answers 404; reinstall the package "
                        "or set server.web_dir", looked)

    @property
    def serves_demo(self) -> bool:
        """Whether a web root holds the demo's index.html."""
        return any((root / "index.html").is_file() for root in self._web_roots)

    async def respond(self, request: Request) -> Response | None:
        """The HTTP response for `request`, or None when it should upgrade to WebSocket (cancel-safe)."""
        target = request.path
        method = getattr(request, "method", "GET")  # websockets < 17 parses GET requests only (no attribute)
        head = method == "HEAD"
        if len(target) > MAX_TARGET_CHARS:
            return text_response(http.HTTPStatus.REQUEST_URI_TOO_LONG, "Request target too long.\n", head=head)
        path = request_path(target)
        if path == REALTIME_PATH:
            if getattr(request, "protocol", "HTTP/1.1") != "HTTP/1.1":
                return text_response(http.HTTPStatus.BAD_REQUEST, "A WebSocket upgrade needs HTTP/1.1.\n")
            return None
        if method not in ("GET", "HEAD"):
            response = text_response(http.HTTPStatus.METHOD_NOT_ALLOWED, "Only GET and HEAD are served.\n")
            response.headers["Allow"] = "GET, HEAD"
            return response
        probe = HEALTH_PROBES.get(path)
        if probe is not None:
            status, payload = self._health(probe)
            return json_response(status, payload, head=head)
        if path == "/v1/models":
            return json_response(http.HTTPStatus.OK, self._models(), head=head)
        if path == "/metrics":
            return _response(http.HTTPStatus.OK, self._metrics.render(), CONTENT_TYPE_LATEST, head=head)
        try:
            return await self._static(_segments(path), head)
        except _BadTarget as bad:
            return text_response(bad.status, bad.text, head=head)

    async def _static(self, segments: list[str], head: bool) -> Response:
        file = self._find(segments)
        if file is None:
            raise _BadTarget(*_NOT_FOUND)
        content_type = _CONTENT_TYPES.get(file.suffix.lower()) or (
            mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        )
        try:
            body = await asyncio.to_thread(file.read_bytes)  # file reads stay off the event loop
        except OSError:
            raise _BadTarget(*_NOT_FOUND) from None
        return _response(http.HTTPStatus.OK, body, content_type, head=head)

    def _find(self, segments: list[str]) -> Path | None:
        """The file under a web root for decoded path `segments`; None for escapes and misses."""
        for root in self._web_roots:
            try:
                candidate = root.joinpath(*segments).resolve()
                if candidate.is_dir():
                    candidate = candidate / "index.html"
                if candidate.is_file() and candidate.is_relative_to(root):
                    return candidate
            except (OSError, ValueError):  # e.g. ENAMETOOLONG, ELOOP
                continue
        return None
