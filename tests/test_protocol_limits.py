"""Bounds checked at parse time (`protocol.limits` and the field codecs): each bad frame is one
`ProtocolError` with a specific code, the param path and the client's event_id when it is usable;
whatever is accepted can always be serialised again."""

from __future__ import annotations

import json

import pytest

from realtime_ming.protocol import Dialect
from realtime_ming.protocol.codec import parse, serialise
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_ECHO_CHARS, ProtocolError
from realtime_ming.protocol.limits import (
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_METADATA_PAIRS,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
    text_problem,
)
from realtime_ming.protocol.server_events import Error, SessionUpdated
from realtime_ming.protocol.session import SessionConfig, apply_patch

GA, BETA = Dialect.GA, Dialect.BETA


def _frame(event: dict, *, raw: dict[str, str] | None = None) -> str:
    """JSON text of `event`; `raw` replaces `"<marker>"` strings by literal JSON text."""
    text = json.dumps(event)
    for marker, literal in (raw or {}).items():
        text = text.replace(f'"{marker}"', literal)
    return text


def _user_text(text: str) -> dict:
    return {"type": "conversation.item.create", "event_id": "e1", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


CASES = [
    # lone surrogates (JSON escapes decode to them) and control characters, wherever they are
    (_frame({"type": "response.create", "event_id": "e1", "response": {"instructions": "x\ud800"}}),
     ErrorCode.INVALID_TEXT, "response.instructions", "e1"),
    (_frame(_user_text("\udc00")), ErrorCode.INVALID_TEXT, "item.content[0].text", "e1"),
    (_frame(_user_text("nul\x00")), ErrorCode.INVALID_TEXT, "item.content[0].text", "e1"),
    (_frame(_user_text("esc\x1b[31m")), ErrorCode.INVALID_TEXT, "item.content[0].text", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tools": [
        {"type": "function", "name": "f", "description": "d\ud83d"}]}}),
     ErrorCode.INVALID_TEXT, "session.tools[0].description", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tracing": {"k\udfff": 1}}}),
     ErrorCode.INVALID_TEXT, "session.tracing", "e1"),
    (_frame({"type": "unknown\ud800"}), ErrorCode.INVALID_TEXT, "type", None),
    (_frame({"type": "response.cancel", "event_id": "e\ud800"}), ErrorCode.INVALID_TEXT, "event_id", None),
    (_frame({"type": "conversation.item.delete", "event_id": "e1", "item_id": "a\nb"}),
     ErrorCode.INVALID_TEXT, "item_id", "e1"),
    # echoed objects keep the shapes the openai types give them
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tracing": {"workflow_name": 3}}}),
     ErrorCode.INVALID_EVENT, "session.tracing.workflow_name", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"prompt": {"id": "p", "variables": {"v": []}}}}),
     ErrorCode.INVALID_EVENT, "session.prompt.variables.v", "e1"),
    # nesting
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tracing": "DEEP"}},
            raw={"DEEP": "[" * 600 + "]" * 600}),
     ErrorCode.NESTING_TOO_DEEP, "session.tracing" + "[0]" * (MAX_JSON_DEPTH - 2), "e1"),
    ("[" * 5000 + "]" * 5000, ErrorCode.NESTING_TOO_DEEP, None, None),
    # numbers
    (_frame({"type": "session.update", "event_id": "e1", "session": {"audio": {"output": {"speed": "N"}}}},
            raw={"N": "9" * 4000}), ErrorCode.INVALID_NUMBER, "session.audio.output.speed", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"audio": {"output": {"speed": "N"}}}},
            raw={"N": "1e999"}), ErrorCode.INVALID_NUMBER, "session.audio.output.speed", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"audio": {"output": {"speed": "N"}}}},
            raw={"N": "-Infinity"}), ErrorCode.INVALID_NUMBER, "session.audio.output.speed", "e1"),
    (_frame({"type": "conversation.item.truncate", "event_id": "e1", "item_id": "i", "content_index": 0,
             "audio_end_ms": "N"}, raw={"N": "1e300"}), ErrorCode.INVALID_NUMBER, "audio_end_ms", "e1"),
    # sizes
    (_frame(_user_text("x" * (MAX_TEXT_CHARS + 1))), ErrorCode.STRING_ABOVE_MAX_LENGTH, "item.content[0].text", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tools": [
        {"type": "function", "name": "f", "description": "d" * (MAX_DESCRIPTION_CHARS + 1)}]}}),
     ErrorCode.STRING_ABOVE_MAX_LENGTH, "session.tools[0].description", "e1"),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"tools": [
        {"type": "function", "name": f"f{i}"} for i in range(MAX_TOOLS + 1)]}}),
     ErrorCode.ARRAY_ABOVE_MAX_LENGTH, "session.tools", "e1"),
    (_frame({"type": "response.create", "event_id": "e1", "response": {"metadata": {
        f"k{i}": "v" for i in range(MAX_METADATA_PAIRS + 1)}}}),
     ErrorCode.OBJECT_ABOVE_MAX_PROPERTIES, "response.metadata", "e1"),
    (_frame({"type": "response.cancel", "event_id": "e" * (MAX_ID_CHARS + 1)}),
     ErrorCode.STRING_ABOVE_MAX_LENGTH, "event_id", None),
    (_frame({"type": "session.update", "event_id": "e1", "session": {"prompt": {"id": "p", "v": "x" * 20_000}}}),
     ErrorCode.JSON_VALUE_TOO_LARGE, "session.prompt", "e1"),
]


@pytest.mark.parametrize(("frame", "code", "param", "event_id"), CASES, ids=[f"{c[1].value}-{c[2]}" for c in CASES])
def test_bad_frame_is_one_specific_error(frame: str, code: ErrorCode, param: str | None, event_id: str | None):
    error = parse(frame, GA)
    assert isinstance(error, ProtocolError), error
    assert (error.code, error.param, error.event_id) == (code, param, event_id), error.message
    wire = serialise(Error.from_protocol_error(error), GA)
    assert wire is not None and len(wire) < 2 * MAX_ECHO_CHARS + 600  # the echo stays small
    wire.encode("utf-8")


def test_text_problem_accepts_text_and_names_the_first_bad_character():
    for good in ("", "plain", "tab\tnew\nline\r", "日本語 👩‍👩‍👧 \u200b \x7f", "\U0001f600"):
        assert text_problem(good) is None
    assert text_problem("ab\ud800") == "a lone UTF-16 surrogate U+D800 at index 2"
    assert text_problem("é\x00") == "a control character U+0000 at index 1"


def test_surrogate_pairs_from_json_escapes_are_one_character_and_accepted():
    event = parse(json.dumps(_user_text("smile \U0001f600")), GA)  # ensure_ascii: "\ud83d\ude00"
    assert not isinstance(event, ProtocolError)
    assert event.item.content[0].text == "smile \U0001f600"


def test_nesting_at_the_limit_is_accepted_and_echoed():
    deep: object = "leaf"
    for _ in range(MAX_JSON_DEPTH - 4):  # frame → session → tracing → metadata (free-form) → … within the limit
        deep = {"k": deep}
    event = parse(json.dumps({"type": "session.update", "session": {"tracing": {"metadata": deep}}}), GA)
    assert not isinstance(event, ProtocolError), event
    config = apply_patch(SessionConfig(), event.session)
    for dialect in (GA, BETA):
        assert serialise(SessionUpdated(session=config), dialect) is not None


def test_error_messages_quote_client_text_briefly():
    error = parse(json.dumps({"type": "x" * 100_000}), GA)
    assert isinstance(error, ProtocolError) and error.code is ErrorCode.UNKNOWN_EVENT
    assert len(error.message) < 200
    choice = parse(json.dumps({"type": "response.create", "response": {"tool_choice": "y" * 100_000}}), GA)
    assert isinstance(choice, ProtocolError) and len(choice.message) < 300


def test_serialise_refuses_an_unencodable_frame():
    error = Error.from_protocol_error(ProtocolError(ErrorCode.SERVER_ERROR, event_id="bad\ud800"))
    with pytest.raises(ValueError):
        serialise(error, GA)
