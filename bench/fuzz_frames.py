"""Seeded generator of hostile and mutated client frames for the protocol fuzzer (`bench.fuzz`).

Every frame comes with what the server must answer: an invalid frame exactly one `error` with
one of `codes` (at `param` where the attack knows it, echoing `event_id` when the frame carried
a usable one); a valid or loosely mutated frame at most one `error`, never `server_error`.

Attacks start from one valid template per client event type (both dialects) and touch every
string leaf (lone surrogates, control characters, line breaks in one-line fields, lengths just
over each field's limit), every object key, every number (thousands of digits, 1e999, NaN,
Infinity), any position (nesting beyond the limit, wrong JSON types), plus unknown and missing
types, binary and truncated frames, non-object JSON and frames over the server's frame limit.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.limits import (
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
)

__all__ = ["ANY", "CLASSES", "PROBE_ITEM_ID", "FrameGenerator", "FuzzFrame", "leaves", "set_leaf", "templates"]

ANY = object()  # "not checked" for an expected param or event_id
PROBE_ITEM_ID = "fz_probe_missing"  # the runner's sync probe retrieves this (never created)

# (class, weight): the mix of one run.
CLASSES: tuple[tuple[str, int], ...] = (
    ("surrogate", 20), ("control", 8), ("line_break", 3), ("too_long", 5), ("deep", 6), ("bad_key", 4),
    ("number", 10), ("wrong_type", 10), ("unknown_type", 3), ("missing_type", 1), ("binary", 3),
    ("truncated", 6), ("garbage", 3), ("oversize", 1), ("bad_event_id", 3), ("valid", 14),
)

_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff", "\udc00\ud800", "a\ud83d", "\ude00b")
_CONTROLS = ("\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x1f")
_CLEAN = ("hello", "héllo wörld", "日本語のテキスト", "emoji 👩‍👩‍👧 ok", "مرحبا", "tab\tand\nline", "\u200bzero width", "DEL\x7f")

# Paths (dotted, as the server names params) of length-limited strings: (max chars, one line).
_ID, _NAME, _TEXT, _DESC = (MAX_ID_CHARS, True), (MAX_NAME_CHARS, True), (MAX_TEXT_CHARS, False), (MAX_DESCRIPTION_CHARS, False)
_LIMITED: dict[str, tuple[int, bool]] = {
    "session.instructions": _TEXT, "session.model": _ID, "session.voice": _NAME,
    "session.audio.input.transcription.model": _ID, "session.audio.input.transcription.language": _ID,
    "session.audio.input.transcription.prompt": _DESC, "session.input_audio_transcription.model": _ID,
    "session.input_audio_transcription.prompt": _DESC, "session.audio.output.voice": _NAME,
    "session.tools[0].name": _NAME, "session.tools[0].description": _DESC, "session.prompt.id": _ID,
    "item.id": _ID, "item.content[0].text": _TEXT, "item.content[1].transcript": _TEXT, "item.name": _NAME,
    "item.arguments": _TEXT, "item.call_id": _ID, "item.output": _TEXT, "previous_item_id": _ID,
    "item_id": _ID, "response_id": _ID, "response.instructions": _TEXT,
    "response.metadata.topic": (MAX_METADATA_VALUE_CHARS, False), "response.input[0].content[0].text": _TEXT,
    "response.input[1].id": _ID, "response.audio.output.voice": _NAME, "response.voice": _NAME,
    "response.tools[0].name": _NAME, "response.tools[0].description": _DESC,
}
# Free text a valid mutation may rewrite (any other string is an id, an enum, a format or base64).
_FREE_TEXT = frozenset(p for p, (_, one_line) in _LIMITED.items() if not one_line) | {
    "session.tracing.workflow_name", "session.prompt.variables.city",
    "session.tools[0].parameters.properties.city.description",
}


def _tone_b64(ms: int) -> str:
    samples = bytearray()
    for i in range(24 * ms):
        value = int(3000 * ((i // 27) % 2 * 2 - 1))  # a 444 Hz square wave, PCM16 LE
        samples += value.to_bytes(2, "little", signed=True)
    return base64.b64encode(bytes(samples)).decode()


_TOOL = {
    "type": "function", "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}}},
}
def _png_data_url(side: int) -> str:
    """A gray `side`×`side` PNG as a data URL (large enough for the vision encoder)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


_PNG = _png_data_url(64)


def templates(dialect: Dialect, voice: str) -> list[dict[str, Any]]:
    """One valid frame per client event type (and per item kind)."""
    user_text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}
    if dialect is Dialect.GA:
        session = {
            "type": "realtime", "model": "ming", "instructions": "Answer briefly.", "output_modalities": ["text"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "whisper-1", "language": "en", "prompt": "city names"},
                    "noise_reduction": {"type": "near_field"},
                    "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                       "silence_duration_ms": 500},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": voice, "speed": 1.0},
            },
            "tools": [copy.deepcopy(_TOOL)], "tool_choice": "auto", "max_output_tokens": 16,
            "tracing": {"workflow_name": "fuzz", "group_id": "g1"},
            "truncation": {"type": "retention_ratio", "retention_ratio": 0.5},
            "prompt": {"id": "pmpt_1", "variables": {"city": "Paris"}},
        }
        response = {
            "conversation": "none", "instructions": "Be short.", "output_modalities": ["text"],
            "max_output_tokens": 8, "metadata": {"topic": "fuzz"}, "tools": [copy.deepcopy(_TOOL)],
            "tool_choice": "none", "audio": {"output": {"voice": voice, "format": {"type": "audio/pcm", "rate": 24000}}},
            "input": [copy.deepcopy(user_text), {"type": "item_reference", "id": "item_missing"}],
        }
        image = {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": _PNG, "detail": "low"}]}
    else:
        session = {
            "instructions": "Answer briefly.", "modalities": ["text"], "voice": voice,
            "input_audio_format": "pcm16", "output_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1", "prompt": "city names"},
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500},
            "tools": [copy.deepcopy(_TOOL)], "tool_choice": "auto", "temperature": 0.8,
            "max_response_output_tokens": 16, "tracing": {"workflow_name": "fuzz"},
        }
        response = {
            "conversation": "none", "instructions": "Be short.", "modalities": ["text"], "voice": voice,
            "max_response_output_tokens": 8, "metadata": {"topic": "fuzz"}, "temperature": 0.8,
            "input": [copy.deepcopy(user_text), {"type": "item_reference", "id": "item_missing"}],
        }
        image = None
    audio_item = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi"}, {"type": "input_audio", "transcript": "hello there"}]}
    items = [
        {"id": "item_fz1", **user_text}, audio_item,
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be kind."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
        {"type": "function_call", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}", "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 21}"},
    ] + ([image] if image else [])
    frames = [
        {"type": "session.update", "session": session},
        {"type": "input_audio_buffer.append", "audio": _tone_b64(20)},
        {"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.clear"},
        {"type": "conversation.item.retrieve", "item_id": "item_fz1"},
        {"type": "conversation.item.delete", "item_id": "item_nope"},
        {"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 100},
        {"type": "response.create", "response": response},
        {"type": "response.cancel", "response_id": "resp_nope"},
        {"type": "output_audio_buffer.clear"},
    ]
    frames += [{"type": "conversation.item.create", "previous_item_id": None, "item": item} for item in items]
    return frames


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(param path, value) of every leaf, in the server's path notation."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}[{index}]")
    else:
        yield path, value


def _objects(value: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """(param path, object) of every object, the frame itself first (path "")."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _objects(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _objects(item, f"{path}[{index}]")


def set_leaf(frame: dict, path: str, value: Any) -> None:
    """Replace the leaf at `path` (as produced by `leaves`)."""
    tokens: list[str | int] = []
    for part in path.split("."):
        name, *indices = part.split("[")
        tokens.append(name)
        tokens += [int(i.rstrip("]")) for i in indices]
    node: Any = frame
    for token in tokens[:-1]:
        node = node[token]
    node[tokens[-1]] = value


def _dumps(frame: Any, *, raw_unicode: bool) -> str:
    """JSON text; non-ASCII as itself (`raw_unicode`) unless it holds a lone surrogate, which a
    WebSocket text frame cannot carry: then the `\\udXXX` escape carries it into the server's JSON."""
    if raw_unicode:
        text = json.dumps(frame, ensure_ascii=False)
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    return json.dumps(frame)


@dataclass(frozen=True, slots=True)
class FuzzFrame:
    """One frame to send and what must come back."""

    kind: str
    data: str | bytes
    invalid: bool  # True: exactly one error with a code in `codes`; False: at most one error
    codes: frozenset[str] = frozenset()
    param: object = ANY  # expected `error.param` (ANY: not checked)
    event_id: object = ANY  # expected `error.event_id` echo


class FrameGenerator:
    """Frames of the `CLASSES` mix for one session (`dialect`, its `voice`), seeded."""

    def __init__(self, seed: int, dialect: Dialect, voice: str, max_frame_bytes: int) -> None:
        self._rng = random.Random(seed)
        self.templates = templates(dialect, voice)
        self._max_frame_bytes = max_frame_bytes
        self._count = 0
        names, weights = zip(*CLASSES, strict=True)
        self._names, self._weights = names, weights

    def next(self) -> FuzzFrame:
        """The next frame of the mix."""
        self._count += 1
        kind = self._rng.choices(self._names, self._weights)[0]
        return getattr(self, f"_{kind}")()

    # ---- helpers ---------------------------------------------------------------------------
    def _base(self) -> tuple[dict, str]:
        frame = copy.deepcopy(self._rng.choice(self.templates))
        event_id = f"fz{self._count}"
        frame["event_id"] = event_id
        return frame, event_id

    def _string_leaf(self, frame: dict, paths: set[str] | frozenset[str] | None = None) -> str | None:
        found = [p for p, v in leaves(frame) if isinstance(v, str) and p != "event_id"]
        if paths is not None:
            found = [p for p in found if p in paths]
        return self._rng.choice(found) if found else None

    def _invalid(self, kind: str, frame: Any, codes: set[str], param: object, event_id: object) -> FuzzFrame:
        data = frame if isinstance(frame, str | bytes) else _dumps(frame, raw_unicode=self._rng.random() < 0.5)
        return FuzzFrame(kind, data, True, frozenset(codes), param, event_id)

    # ---- classes ---------------------------------------------------------------------------
    def _surrogate(self) -> FuzzFrame:
        frame, event_id = self._base()
        path = self._string_leaf(frame) or "type"
        old = str(dict(leaves(frame)).get(path, ""))
        cut = self._rng.randint(0, len(old[:40]))
        set_leaf(frame, path, old[:cut] + self._rng.choice(_SURROGATES) + old[cut:40])
        return self._invalid("surrogate", frame, {"invalid_text"}, path, event_id)

    def _control(self) -> FuzzFrame:
        frame, event_id = self._base()
        path = self._string_leaf(frame) or "type"
        set_leaf(frame, path, "a" + self._rng.choice(_CONTROLS) + "b")
        return self._invalid("control", frame, {"invalid_text"}, path, event_id)

    def _line_break(self) -> FuzzFrame:
        frame, event_id = self._base()
        path = self._string_leaf(frame, {p for p, (_, one_line) in _LIMITED.items() if one_line})
        if path is None:
            return self._control()
        set_leaf(frame, path, "first" + self._rng.choice(("\n", "\r", "\t")) + "second")
        return self._invalid("line_break", frame, {"invalid_text"}, path, event_id)

    def _too_long(self) -> FuzzFrame:
        frame, event_id = self._base()
        path = self._string_leaf(frame, set(_LIMITED))
        if path is None:
            return self._bad_event_id()
        limit = _LIMITED[path][0]
        set_leaf(frame, path, "x" * self._rng.randint(limit + 1, limit + 1 + min(limit, 4096)))
        return self._invalid("too_long", frame, {"string_above_max_length"}, path, event_id)

    def _deep(self) -> FuzzFrame:
        frame, event_id = self._base()
        depth = self._rng.choice((MAX_JSON_DEPTH + 1, 100, 500, 999, 1500, 5000, 50_000))
        opener, closer = self._rng.choice((("[", "]"), ('{"a":', "}")))
        marker = "__FUZZ_DEEP__"
        where = self._rng.choice(("session.tracing", "prompt", "metadata", "extra"))
        if frame["type"] == "session.update" and "tracing" in frame["session"]:
            frame["session"]["tracing"] = {"nested": marker}
        else:
            frame[where.split(".")[-1]] = marker
        data = json.dumps(frame).replace(f'"{marker}"', opener * depth + "1" + closer * depth)
        code = "frame_too_large" if len(data) > self._max_frame_bytes else "nesting_too_deep"
        return self._invalid("deep", data, {code}, ANY, ANY)

    def _bad_key(self) -> FuzzFrame:
        frame, event_id = self._base()
        path, obj = self._rng.choice(list(_objects(frame)))
        obj["k" + self._rng.choice(_SURROGATES + _CONTROLS)] = 1
        return self._invalid("bad_key", frame, {"invalid_text"}, path or None, event_id)

    def _number(self) -> FuzzFrame:
        frame, event_id = self._base()
        numbers = [p for p, v in leaves(frame) if isinstance(v, int | float) and not isinstance(v, bool)]
        path = self._rng.choice(numbers) if numbers else "extra_number"
        literal = self._rng.choice((
            "9" * self._rng.randint(21, 6000), "-" + "1" * 4500, "1e999", "-1e999", "NaN", "Infinity", "-Infinity",
            "1" + "0" * 400 + ".5",
        ))
        marker = "__FUZZ_NUMBER__"
        if path == "extra_number":
            frame[path] = marker
        else:
            set_leaf(frame, path, marker)
        return self._invalid("number", json.dumps(frame).replace(f'"{marker}"', literal), {"invalid_number"}, path, event_id)

    def _wrong_type(self) -> FuzzFrame:
        frame, event_id = self._base()
        found = [p for p, _ in leaves(frame) if p not in ("type", "event_id")]
        if not found:
            return self._unknown_type()
        path = self._rng.choice(found)
        set_leaf(frame, path, self._rng.choice((None, True, 0, -1, 3.5, "", "str", [], [1, "a"], {}, {"x": None})))
        return FuzzFrame("wrong_type", json.dumps(frame), False)

    def _unknown_type(self) -> FuzzFrame:
        frame, event_id = self._base()
        frame["type"] = self._rng.choice(("session.create", "response.created", "", "x" * 5000, "RESPONSE.CREATE", "a.b.c"))
        return self._invalid("unknown_type", frame, {"unknown_event"}, "type", event_id)

    def _missing_type(self) -> FuzzFrame:
        frame, event_id = self._base()
        del frame["type"]
        return self._invalid("missing_type", frame, {"invalid_event"}, "type", event_id)

    def _binary(self) -> FuzzFrame:
        size = self._rng.choice((0, 1, 16, 1024, 65536))
        return self._invalid("binary", self._rng.randbytes(size), {"binary_frame_unsupported"}, None, None)

    def _truncated(self) -> FuzzFrame:
        frame, _ = self._base()
        text = json.dumps(frame)
        return self._invalid("truncated", text[: self._rng.randint(0, len(text) - 1)], {"invalid_json"}, None, None)

    def _garbage(self) -> FuzzFrame:
        text = self._rng.choice(("[]", "1", '"text"', "null", "true", "[{}]", "{}x", "}{", "\u00ff\u0100", "'single'"))
        codes = {"invalid_json", "invalid_event"}
        return self._invalid("garbage", text, codes, ANY, None)

    def _oversize(self) -> FuzzFrame:
        frame, _ = self._base()
        frame["padding"] = "p" * (self._max_frame_bytes + self._rng.randint(1, 4096))
        return self._invalid("oversize", frame, {"frame_too_large"}, None, None)

    def _bad_event_id(self) -> FuzzFrame:
        frame, _ = self._base()
        frame["event_id"], code = self._rng.choice((
            ("e\ud800", "invalid_text"), ("e\x00", "invalid_text"), ("e" * (MAX_ID_CHARS + 1), "string_above_max_length"),
            (17, "invalid_event"), ({"a": 1}, "invalid_event"),
        ))
        return self._invalid("bad_event_id", frame, {code}, "event_id", None)

    def _valid(self) -> FuzzFrame:
        frame, _ = self._base()
        for path, value in list(leaves(frame)):
            if path in _FREE_TEXT and isinstance(value, str) and self._rng.random() < 0.5:
                set_leaf(frame, path, self._rng.choice(_CLEAN)[: _LIMITED.get(path, (64, False))[0]])
        if frame["type"] == "response.create":
            if self._rng.random() < 0.7:  # keep generation rare: the engine is shared
                frame = {"type": "response.cancel", "event_id": frame["event_id"]}
            else:  # a reference to a missing item is an error; the valid mix leaves it out
                frame["response"]["input"] = frame["response"]["input"][:1]
        return FuzzFrame("valid", _dumps(frame, raw_unicode=True), False)
