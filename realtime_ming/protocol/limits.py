"""Bounds every client frame must satisfy before any of its fields is read, and per-field sizes.

`load_json` decodes a text frame and `check_json` walks every value once (iteratively, so no depth can
exhaust the stack): nesting deeper than `MAX_JSON_DEPTH`, `NaN`/`Infinity`, numbers that
overflow a double or integers longer than `MAX_INTEGER_DIGITS` digits, and text (keys included)
holding a lone UTF-16 surrogate (`"\\ud800"` decodes to one in Python and can never be encoded
as UTF-8) or a C0 control character other than tab, newline and carriage return are refused
with `nesting_too_deep` / `invalid_number` / `invalid_text` and the param path. Whatever passes
is plain, finite, encodable JSON: echoing it can never fail.

The per-field limits below are applied by the field codecs (`wire.expect_text` and friends);
`metadata` follows OpenAI's documented bounds (16 pairs, 64-character keys, 512-character values).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import ProtocolError

__all__ = [
    "CAPPED_UNLESS_MEDIA_TYPES",
    "MAX_CONTENT_PARTS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_ECHO_JSON_BYTES",
    "MAX_ID_CHARS",
    "MAX_INPUT_ITEMS",
    "MAX_INTEGER_DIGITS",
    "MAX_JSON_DEPTH",
    "MEDIA_EVENT_TYPES",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE_CHARS",
    "MAX_NAME_CHARS",
    "MAX_SCHEMA_JSON_BYTES",
    "MAX_TEXT_CHARS",
    "MAX_TOOLS",
    "MAX_TOOLS_JSON_BYTES",
    "MAX_VIDEO_FRAMES",
    "check_json",
    "check_tools_size",
    "load_json",
    "text_problem",
]

MAX_JSON_DEPTH: Final = 64  # nested arrays/objects in one frame (a tool's JSON schema is the deepest)
MAX_INTEGER_DIGITS: Final = 20  # an int64 has at most 19 digits
MAX_ID_CHARS: Final = 128  # event, item, call and response ids; model and language names
MAX_NAME_CHARS: Final = 64  # function names and voices
MAX_TEXT_CHARS: Final = 131_072  # message text, transcripts, instructions, call arguments/outputs
MAX_DESCRIPTION_CHARS: Final = 8192  # a tool description, a transcription prompt
MAX_TOOLS: Final = 128
MAX_CONTENT_PARTS: Final = 64  # content parts of one message
MAX_VIDEO_FRAMES: Final = 512  # frames of one `input_video` part (sampled down to the model's rate)
MAX_INPUT_ITEMS: Final = 1024  # items and references in a `response.create` `input`
MAX_METADATA_PAIRS: Final = 16
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 512
MAX_SCHEMA_JSON_BYTES: Final = 65_536  # one tool's `parameters`
# a `tools` array in all (compact UTF-8 JSON): past it no context the server serves could hold the tools (about 300 K
# tokens), and megabytes of small JSON values cost a decoder tenths of a second (128 tools at the per-tool limits: 9 MB)
MAX_TOOLS_JSON_BYTES: Final = 1_048_576
# the client events that may carry media (base64 audio, image data URLs, video): only these may take a frame up to
# `server.limits.max_frame_bytes`; every other event has the far smaller control-frame cap (`codec.parse`)
MEDIA_EVENT_TYPES: Final = frozenset({"input_audio_buffer.append", "conversation.item.create", "response.create"})
# the media events whose other content has no bound of its own below the frame cap (a response's tools and up to
# `MAX_INPUT_ITEMS` input items; an item has at most `MAX_CONTENT_PARTS` parts, an append one string): a frame of
# them over the control-frame cap must carry media (`media_scan`), else it is refused as a control frame would be
CAPPED_UNLESS_MEDIA_TYPES: Final = frozenset({"response.create"})
MAX_ECHO_JSON_BYTES: Final = 16_384  # free-form objects that are only echoed (`tracing`, `prompt`)

# UTF-8 bytes of the refused C0 controls (tab, newline and carriage return are text). Any other
# byte is kept by `bytes.translate(None, _KEEP)`, which thus yields exactly the refused ones.
_REFUSED_CONTROLS: Final = frozenset(range(0x20)) - {0x09, 0x0A, 0x0D}
_KEEP: Final = bytes(b for b in range(256) if b not in _REFUSED_CONTROLS)


def text_problem(text: str) -> str | None:
    """Why `text` cannot be accepted (a lone surrogate or a control character), or None."""
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # only lone surrogates are unencodable
        return f"a lone UTF-16 surrogate U+{ord(text[exc.start]):04X} at index {exc.start}"
    refused = encoded.translate(None, _KEEP)
    if refused:
        index = text.index(chr(refused[0]))
        return f"a control character U+{refused[0]:04X} at index {index}"
    return None


class _Oversized:
    """An integer literal with too many digits (kept unconverted: int() of it is quadratic)."""

    __slots__ = ("num_digits",)

    def __init__(self, num_digits: int) -> None:
        self.num_digits = num_digits


class _Constant:
    """`NaN`, `Infinity` or `-Infinity` (not JSON, but Python's decoder reads them)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _parse_int(literal: str) -> int | _Oversized:
    digits = len(literal) - literal.startswith("-")
    return _Oversized(digits) if digits > MAX_INTEGER_DIGITS else int(literal)


def _render(node: tuple | None) -> str:
    """The param path of a walk node `(parent, key)` (`session.tools[0].name`)."""
    keys: list[str | int] = []
    while node is not None:
        node, key = node
        keys.append(key)
    path = ""
    for key in reversed(keys):
        if isinstance(key, int):
            path = f"{path}[{key}]"
        else:
            path = f"{path}.{key}" if path else key
    return path


def _check_number(value: object, node: tuple | None) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(ErrorCode.INVALID_NUMBER, param=_render(node), detail="the number overflows a double")
    elif isinstance(value, _Oversized):
        raise ProtocolError(
            ErrorCode.INVALID_NUMBER,
            param=_render(node),
            detail=f"an integer of {value.num_digits} digits (at most {MAX_INTEGER_DIGITS})",
        )
    elif isinstance(value, _Constant):
        raise ProtocolError(ErrorCode.INVALID_NUMBER, param=_render(node), detail=f"{value.name} is not a JSON number")


def _check_key(key: str, node: tuple | None) -> None:
    problem = text_problem(key)
    if problem is not None:  # the key itself is not quoted: it is the invalid text
        where = _render(node)
        detail = f"a key of '{where}' has {problem}" if where else f"a key of the frame has {problem}"
        raise ProtocolError(ErrorCode.INVALID_TEXT, param=where or None, detail=detail)


def _walk(root: Any) -> None:
    stack: list[tuple[Any, tuple | None, int]] = [(root, None, 0)]
    while stack:
        value, node, depth = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                where = _render(node)
                detail = f"'{where}' has {problem}" if where else f"the frame has {problem}"
                raise ProtocolError(ErrorCode.INVALID_TEXT, param=where or None, detail=detail)
        elif isinstance(value, dict | list):
            if depth >= MAX_JSON_DEPTH:
                where = _render(node)
                raise ProtocolError(
                    ErrorCode.NESTING_TOO_DEEP,
                    param=where or None,
                    max_depth=MAX_JSON_DEPTH,
                    where=f" (at '{where}')" if where else "",
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_key(key, node)
                    stack.append((item, (node, key), depth + 1))
            else:
                stack.extend((item, (node, index), depth + 1) for index, item in enumerate(value))
        elif not isinstance(value, bool | int) and value is not None:
            _check_number(value, node)


def load_json(frame: str) -> Any:
    """Decode one text frame; raises `ProtocolError` (`invalid_json`, `nesting_too_deep`).

    The result may hold unchecked numbers: pass it to `check_json` before reading any field.
    """
    try:
        return json.loads(frame, parse_int=_parse_int, parse_constant=_Constant)
    except RecursionError:
        raise ProtocolError(ErrorCode.NESTING_TOO_DEEP, max_depth=MAX_JSON_DEPTH, where="") from None
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, detail=str(exc)) from None


def check_json(value: Any) -> None:
    """Check every value of a decoded frame (see the module doc); raises `ProtocolError`."""
    _walk(value)


def check_tools_size(tools: list, param: str) -> None:
    """Refuse a `tools` array over `MAX_TOOLS_JSON_BYTES` (`tools_too_large`). Works on a decoded but not yet
    checked array too (an odd number counts as `null`): measured tool by tool, and only until it is over, so the
    work is bounded by the limit, not by the size of the array."""
    num_bytes = 2 + max(len(tools) - 1, 0)  # the brackets and commas
    for tool in tools:
        text = json.dumps(tool, ensure_ascii=False, separators=(",", ":"), default=lambda _o: None)
        num_bytes += len(text.encode("utf-8", "surrogatepass"))
        if num_bytes > MAX_TOOLS_JSON_BYTES:
            raise ProtocolError(ErrorCode.TOOLS_TOO_LARGE, param=param, num_bytes=num_bytes,
                                max_bytes=MAX_TOOLS_JSON_BYTES)
