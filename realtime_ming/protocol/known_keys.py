"""Strict keys: a client event key that OpenAI does not define is `unknown_parameter`, naming its path.

The known keys are the openai package's client event types (`assets/openai_client_keys.json`, made by
`tests/client_keys_support.py` from `openai.types.realtime` / `openai.types.beta.realtime`) plus this
server's documented extensions (`realtime_ming.*`, the `input_video` part, GA `response.temperature`) and
the session object's read-only `id`, `object`, `expires_at` (ignored in a `session.update`).
A tree node is `{}` (free-form: any keys), or carries `keys` (object keys -> node), `items` (array
entries) and `variants` (objects split by their `type`; an unknown or absent `type` checks against all).
The check only looks at keys; values are validated afterwards by the event's own decoder.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Final

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.wire import join

__all__ = ["check_known_keys", "event_key_tree", "merge_key_trees"]

KeyTree = dict[str, Any]

_SPEECH: Final = {}  # `realtime_ming.speech` checks its own keys (invalid_speech_style)
_VIDEO_PART: Final = {"keys": {"frames": {"items": {"keys": {"image_url": {}, "timestamp_s": {}}}}, "video_url": {}}}


def _extensions(dialect: Dialect) -> KeyTree:
    # The session object's read-only keys are accepted and ignored: clients send a session they read back.
    session_ext = {"keys": {"realtime_ming": {"keys": {"timing_events": {}, "speech": _SPEECH, "output_lead_ms": {},
                                                       "output_audio_buffer": {}}},
                            "id": {}, "object": {}, "expires_at": {}}}
    response_ext: KeyTree = {"keys": {"realtime_ming": {"keys": {"speed": {}, "speech": _SPEECH}}}}
    if dialect is Dialect.BETA:
        return {"variants": {"session.update": {"keys": {"session": session_ext}},
                             "response.create": {"keys": {"response": response_ext}}}}
    message = {"variants": {"message": {"keys": {"content": {"items": _VIDEO_PART}}}}}
    # GA `response.temperature`: not in the GA schema, sent by clients ported from beta, and applied.
    response_ext = merge_key_trees(response_ext, {"keys": {"temperature": {}, "input": {"items": message}}})
    return {"variants": {
        "session.update": {"keys": {"session": {"variants": {"realtime": session_ext, "transcription": session_ext}}}},
        "response.create": {"keys": {"response": response_ext}},
        "conversation.item.create": {"keys": {"item": message}},
    }}


def merge_key_trees(a: KeyTree, b: KeyTree) -> KeyTree:
    """The union of two key trees (keys, items and variants merged level by level)."""
    out = dict(a)
    for part in ("keys", "variants"):
        if part in b:
            merged = dict(a.get(part, {}))
            for key, node in b[part].items():
                merged[key] = merge_key_trees(merged[key], node) if key in merged else node
            out[part] = merged
    if "items" in b:
        out["items"] = merge_key_trees(a["items"], b["items"]) if "items" in a else b["items"]
    return out


@cache
def _tree(dialect: Dialect) -> KeyTree:
    text = resources.files("realtime_ming").joinpath("assets/openai_client_keys.json").read_text()
    tree = merge_key_trees(json.loads(text)[dialect.value], _extensions(dialect))
    if dialect is Dialect.GA:
        # a realtime session's keys sent to a transcription session are known, not typos: the session check refuses
        # them with their specific code (`realtime_only_parameter`)
        sessions = tree["variants"]["session.update"]["keys"]["session"]["variants"]
        sessions["transcription"] = merge_key_trees(sessions["transcription"], sessions["realtime"])
    return tree


def event_key_tree(dialect: Dialect) -> KeyTree:
    """The known keys of every client event of `dialect` (variants by event `type`)."""
    return _tree(dialect)


def _object_keys(node: KeyTree, obj: Mapping[str, Any]) -> dict[str, KeyTree] | None:
    """The known keys for object `obj` at `node`; `None` when the node is free-form."""
    variants = node.get("variants")
    if variants:
        tag = obj.get("type")
        chosen = variants.get(tag) if isinstance(tag, str) else None
        if chosen is not None:
            return chosen.get("keys")
        merged: KeyTree = {}
        for variant in variants.values():
            merged = merge_key_trees(merged, variant)
        return merged.get("keys")
    return node.get("keys")


def _unknown(key: str, known: Mapping[str, Any], param: str) -> ProtocolError:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ProtocolError(ErrorCode.UNKNOWN_PARAMETER, param=join(param, clip(key, MAX_QUOTE_CHARS)), hint=hint)


def _check(value: Any, node: KeyTree, param: str) -> None:
    if isinstance(value, dict):
        keys = _object_keys(node, value)
        if keys is None:
            return
        for key, item in value.items():
            if key not in keys:
                raise _unknown(key, keys, param)
            _check(item, keys[key], join(param, key))
    elif isinstance(value, list) and "items" in node:
        for index, item in enumerate(value):
            _check(item, node["items"], join(param, index))


def check_known_keys(obj: Mapping[str, Any], dialect: Dialect, *path: str) -> None:
    """Raise `unknown_parameter` for the first key of `obj` that `dialect` does not define.

    `obj` is a whole client event, or with `path` (e.g. `"session.update", "session"`) the value found at
    that key path inside one; its param path is then the last key (`session.instuctions`). An event type
    the openai package does not define is left to its decoder.
    """
    node = event_key_tree(dialect)
    if path:
        node = node["variants"].get(path[0], {})
        for key in path[1:]:
            node = node.get("keys", {}).get(key, {})
    _check(obj, node, path[-1] if len(path) > 1 else "")
