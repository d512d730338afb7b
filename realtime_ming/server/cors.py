"""CORS for the browser-facing HTTP API (`/v1/realtime/calls`, `/v1/realtime/client_secrets`).

A page on another origin (an app beside this server) sends `Authorization` and a JSON or SDP body, so the
browser asks first (`OPTIONS` preflight). An Origin is allowed when `server.auth.allowed_origins` is empty
(as for the WebSocket, where browsers need no CORS at all) or lists it; the answer then names that origin,
never `*`, and exposes `Location` (the call id of a new call). A disallowed Origin gets no CORS headers: the
browser hides the response from the page.
"""

from __future__ import annotations

import http

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .config import AuthConfig

__all__ = ["allow_origin", "preflight"]

_MAX_AGE_S = 600
_SAFE_HEADER = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_, ")


def _allowed(request: Request, auth: AuthConfig) -> str | None:
    origins = request.headers.get_all("Origin")
    if len(origins) != 1:
        return None
    origin = origins[0]
    return origin if not auth.allowed_origins or origin in auth.allowed_origins else None


def allow_origin(response: Response, request: Request, auth: AuthConfig) -> Response:
    """`response` with the CORS headers its request's Origin is allowed (none for a disallowed one)."""
    origin = _allowed(request, auth)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "Location"
        response.headers["Vary"] = "Origin"
    return response


def preflight(request: Request, auth: AuthConfig, methods: str) -> Response:
    """The answer to an `OPTIONS` preflight: 204, with the methods and the headers asked for when allowed."""
    headers = Headers()
    headers["Content-Length"] = "0"
    headers["Allow"] = f"{methods}, OPTIONS"
    response = Response(http.HTTPStatus.NO_CONTENT.value, http.HTTPStatus.NO_CONTENT.phrase, headers, b"")
    if _allowed(request, auth) is None:
        return response
    allow_origin(response, request, auth)
    response.headers["Access-Control-Allow-Methods"] = f"{methods}, OPTIONS"
    asked = request.headers.get("Access-Control-Request-Headers", "")
    if asked and set(asked.lower()) <= _SAFE_HEADER:
        response.headers["Access-Control-Allow-Headers"] = asked
    response.headers["Access-Control-Max-Age"] = str(_MAX_AGE_S)
    return response
