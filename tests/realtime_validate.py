"""Strict checks of emitted server frames against outside truth, shared by protocol and server tests.

GA frames must validate as `openai.types.realtime.RealtimeServerEvent` (openai 3.54) and be one
of pipecat's 31 types; beta frames must validate as `openai.types.beta.realtime.RealtimeServerEvent`.
Our `realtime_ming.response.timings` extension is accepted only when the caller allows it, and the WebRTC
`output_audio_buffer.*` events only for a GA frame of a transport that owns the playout (`allow_playout`).
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent as GaServerEvent
from pydantic import TypeAdapter

from realtime_ming.protocol import (
    GA_CLIENT_SAFE_SERVER_TYPES,
    GA_OPT_IN_SERVER_TYPES,
    PLAYOUT_SERVER_TYPES,
    TIMINGS_EVENT_TYPE,
    Dialect,
)

__all__ = ["validate_server_event"]

_ADAPTERS: dict[Dialect, TypeAdapter[Any]] = {
    Dialect.GA: TypeAdapter(GaServerEvent),
    Dialect.BETA: TypeAdapter(BetaServerEvent),
}


def _validate_timings(obj: dict[str, Any]) -> None:
    if set(obj) != {"type", "event_id", "response_id", "timings"}:
        raise AssertionError(f"timings event has keys {sorted(obj)}")
    if not isinstance(obj["event_id"], str) or not isinstance(obj["response_id"], str):
        raise AssertionError("timings event needs string event_id and response_id")
    timings = obj["timings"]
    if not isinstance(timings, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in timings.items()
    ):
        raise AssertionError(f"timings must map names to milliseconds, got {timings!r}")


def validate_server_event(
    obj: dict[str, Any] | str, dialect: Dialect, *, allow_timings: bool = False, allow_opt_in: bool = False,
    allow_playout: bool = False,
) -> None:
    """Raise (`AssertionError` or pydantic `ValidationError`) unless `obj` is a valid frame for `dialect`.

    Validation is pydantic strict mode (no string-to-number coercion). `obj` may be the JSON text.
    """
    if isinstance(obj, str):
        obj = json.loads(obj)
    if not isinstance(obj, dict):
        raise AssertionError(f"a server frame must be a JSON object, got {type(obj).__name__}")
    event_type = obj.get("type")
    if event_type == TIMINGS_EVENT_TYPE:
        if not allow_timings:
            raise AssertionError(f"{TIMINGS_EVENT_TYPE} was sent without the client's opt-in")
        _validate_timings(obj)
        return
    opt_in = (GA_OPT_IN_SERVER_TYPES if allow_opt_in else frozenset()) | (
        PLAYOUT_SERVER_TYPES if allow_playout and dialect is Dialect.GA else frozenset())
    if dialect is Dialect.GA and event_type not in GA_CLIENT_SAFE_SERVER_TYPES | opt_in:
        raise AssertionError(f"{event_type!r} is not one of pipecat's 31 GA server event types (or allowed extra)")
    _ADAPTERS[dialect].validate_python(obj, strict=True)
