"""Bad client frames: each class of bad input gives one `ProtocolError` with a stable code, param
path, echoed `event_id` and message; the `ErrorCode` list itself is frozen API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from realtime_ming.protocol import Dialect, ErrorCode, ErrorType, ProtocolError, parse
from realtime_ming.protocol.codec import refuse_by_leading_type

PNG = "data:image/png;base64,iVBORw0KGgo="
TOOL_WIRE = {"type": "function", "name": "lookup", "description": "", "parameters": {"type": "object"}}


def _update(session: dict[str, Any]) -> str:
    return json.dumps({"type": "session.update", "event_id": "u1", "session": session})


def _item(item: dict[str, Any]) -> str:
    return json.dumps({"type": "conversation.item.create", "event_id": "i1", "item": item})


def _user(part: dict[str, Any]) -> str:
    return _item({"type": "message", "role": "user", "content": [part]})


GA, BETA = Dialect.GA, Dialect.BETA
# (frame, dialect, code, param, echoed event_id)
BAD_FRAMES: list[tuple[str | bytes, Dialect, ErrorCode, str | None, str | None]] = [
    (b'{"type":"response.create"}', GA, ErrorCode.BINARY_FRAME_UNSUPPORTED, None, None),
    ('{"type": ', GA, ErrorCode.INVALID_JSON, None, None),
    ('{"type": "response.create", "x": NaN}', GA, ErrorCode.INVALID_NUMBER, "x", None),
    ("[" * 100_000, GA, ErrorCode.NESTING_TOO_DEEP, None, None),
    ("[1, 2]", GA, ErrorCode.INVALID_EVENT, None, None),
    ('"response.create"', BETA, ErrorCode.INVALID_EVENT, None, None),
    ('{"event_id": "e1"}', GA, ErrorCode.INVALID_EVENT, "type", "e1"),
    ('{"type": 5, "event_id": "e2"}', GA, ErrorCode.INVALID_EVENT, "type", "e2"),
    ('{"type": "response.create", "event_id": 7}', GA, ErrorCode.INVALID_EVENT, "event_id", None),
    ('{"type": "response.text.delta", "event_id": "e3"}', GA, ErrorCode.UNKNOWN_EVENT, "type", "e3"),
    ('{"type": "input_audio_buffer.append", "event_id": "e4"}', GA, ErrorCode.INVALID_EVENT, "audio", "e4"),
    ('{"type": "input_audio_buffer.append", "audio": 12}', BETA, ErrorCode.INVALID_EVENT, "audio", None),
    (
        '{"type": "conversation.item.truncate", "item_id": "i", "content_index": "0", "audio_end_ms": 5}',
        GA,
        ErrorCode.INVALID_EVENT,
        "content_index",
        None,
    ),
    (
        '{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -1}',
        GA,
        ErrorCode.INVALID_VALUE,
        "audio_end_ms",
        None,
    ),
    ('{"type": "conversation.item.delete", "item_id": null}', GA, ErrorCode.INVALID_EVENT, "item_id", None),
    (
        _item({"type": "message", "role": "robot", "content": []}),
        GA,
        ErrorCode.INVALID_VALUE,
        "item.role",
        "i1",
    ),
    (
        _item({"type": "message", "role": "user", "content": []}),
        GA,
        ErrorCode.INVALID_VALUE,
        "item.content",
        "i1",
    ),
    (_item({"type": "reasoning"}), GA, ErrorCode.INVALID_VALUE, "item.type", "i1"),
    (_item({"type": "item_reference", "id": "x"}), GA, ErrorCode.INVALID_VALUE, "item.type", "i1"),
    (_item({"type": "function_call", "name": "f"}), GA, ErrorCode.INVALID_EVENT, "item.arguments", "i1"),
    (
        _item({"type": "message", "role": "assistant", "content": [{"type": "input_audio", "audio": "AA"}]}),
        GA,
        ErrorCode.UNSUPPORTED_CONTENT,
        "item.content[0].type",
        "i1",
    ),
    (_user({"type": "input_text", "text": 5}), GA, ErrorCode.INVALID_EVENT, "item.content[0].text", "i1"),
    (_user({"type": "input_audio"}), GA, ErrorCode.INVALID_VALUE, "item.content[0]", "i1"),
    (_user({"type": "video"}), GA, ErrorCode.INVALID_VALUE, "item.content[0].type", "i1"),
    (
        _user({"type": "input_image", "image_url": "https://example.com/cat.png"}),
        GA,
        ErrorCode.INVALID_IMAGE,
        "item.content[0].image_url",
        "i1",
    ),
    (
        _user({"type": "input_image", "image_url": PNG}),
        BETA,
        ErrorCode.INVALID_VALUE,
        "item.content[0].type",
        "i1",
    ),
    ('{"type": "session.update", "session": "x"}', GA, ErrorCode.INVALID_EVENT, "session", None),
    ('{"type": "session.update"}', GA, ErrorCode.INVALID_EVENT, "session", None),
    (
        _update({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}),
        GA,
        ErrorCode.UNSUPPORTED_SAMPLE_RATE,
        "session.audio.input.format.rate",
        "u1",
    ),
    (
        _update({"audio": {"output": {"format": {"type": "audio/opus"}}}}),
        GA,
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        "session.audio.output.format.type",
        "u1",
    ),
    (
        _update({"input_audio_format": "opus"}),
        BETA,
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        "session.input_audio_format",
        "u1",
    ),
    (
        _update({"audio": {"input": {"turn_detection": {"type": "vad_v2"}}}}),
        GA,
        ErrorCode.UNSUPPORTED_TURN_DETECTION,
        "session.audio.input.turn_detection.type",
        "u1",
    ),
    (_update({"type": "translation"}), GA, ErrorCode.UNSUPPORTED_SESSION_TYPE, "session.type", "u1"),
    (_update({"voice": "alloy"}), GA, ErrorCode.UNKNOWN_PARAMETER, "session.voice", "u1"),
    (
        _update({"audio": {"output": {"voice": "ash"}}}),
        BETA,
        ErrorCode.UNKNOWN_PARAMETER,
        "session.audio",
        "u1",
    ),
    (
        _update({"output_modalities": ["text", "audio"]}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.output_modalities",
        "u1",
    ),
    (
        _update({"output_modalities": ["video"]}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.output_modalities[0]",
        "u1",
    ),
    (
        _update({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 1.5}}}}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.audio.input.turn_detection.threshold",
        "u1",
    ),
    (
        _update({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}),
        BETA,
        ErrorCode.INVALID_VALUE,
        "session.turn_detection.eagerness",
        "u1",
    ),
    (_update({"max_output_tokens": 5000}), GA, ErrorCode.INVALID_VALUE, "session.max_output_tokens", "u1"),
    (
        _update({"audio": {"output": {"speed": 3}}}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.audio.output.speed",
        "u1",
    ),
    (_update({"audio": {"input": "pcm"}}), GA, ErrorCode.INVALID_EVENT, "session.audio.input", "u1"),
    (_update({"temperature": 2.0}), BETA, ErrorCode.INVALID_VALUE, "session.temperature", "u1"),
    (
        _update({"tools": [{"type": "mcp", "server_label": "x"}]}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.tools[0].server_url",
        "u1",
    ),
    (
        _update({"tools": [{"type": "mcp", "server_label": "x", "connector_id": "connector_gmail"}]}),
        GA,
        ErrorCode.UNSUPPORTED_PARAMETER,
        "session.tools[0].connector_id",
        "u1",
    ),
    (
        _update({"tools": [{"type": "code_interpreter"}]}),
        GA,
        ErrorCode.INVALID_VALUE,
        "session.tools[0].type",
        "u1",
    ),
    (_update({"tools": [TOOL_WIRE, TOOL_WIRE]}), GA, ErrorCode.INVALID_VALUE, "session.tools[1].name", "u1"),
    (_update({"tool_choice": "sometimes"}), GA, ErrorCode.INVALID_VALUE, "session.tool_choice", "u1"),
    (
        _update({"realtime_ming": {"timing_events": "yes"}}),
        GA,
        ErrorCode.INVALID_EVENT,
        "session.realtime_ming.timing_events",
        "u1",
    ),
    (
        '{"type": "response.create", "response": {"conversation": "conv_1"}}',
        GA,
        ErrorCode.INVALID_VALUE,
        "response.conversation",
        None,
    ),
    (
        '{"type": "response.create", "response": {"metadata": {"k": 1}}}',
        GA,
        ErrorCode.INVALID_EVENT,
        "response.metadata.k",
        None,
    ),
]


@pytest.mark.parametrize(("frame", "dialect", "code", "param", "event_id"), BAD_FRAMES)
def test_parse_bad_frame_gives_code_and_param(
    frame: str | bytes, dialect: Dialect, code: ErrorCode, param: str | None, event_id: str | None
) -> None:
    """Each class of bad input yields one ProtocolError with a stable code, param path and echoed event_id."""
    error = parse(frame, dialect)
    assert isinstance(error, ProtocolError)
    assert (error.code, error.param, error.event_id) == (code, param, event_id)
    assert error.message == str(error)


def test_parse_error_messages_are_stable() -> None:
    """Error messages render from the code's template exactly."""
    messages = {
        b"\x00": "Binary frames are not supported; send events as JSON text frames.",
        '{"type": "foo"}': "Unknown event type 'foo'.",
        "[]": "Invalid event: the frame must be a JSON object.",
        '{"type": "input_audio_buffer.append"}': "Invalid event: missing required field 'audio'.",
        '{"type": "input_audio_buffer.append", "audio": 1}': "Invalid event: 'audio' must be a string, got an integer.",
        _update({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}): (
            "Unsupported sample rate 8000 Hz for audio/pcm; supported rates: 16000, 24000, 44100."
        ),
        _update({"voice": "x"}): "Unknown parameter: 'session.voice'. Nothing of the event was applied.",
        '{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -1}': (
            "Invalid value for 'audio_end_ms': -1 is outside the range [0, inf]."
        ),
    }
    for frame, message in messages.items():
        error = parse(frame, Dialect.GA)
        assert isinstance(error, ProtocolError)
        assert error.message == message
    invalid_json = parse("{", Dialect.GA)
    assert isinstance(invalid_json, ProtocolError)
    assert invalid_json.message.startswith("The frame is not valid JSON: Expecting property name")


FROZEN_CODES = {
    "invalid_json": ErrorType.INVALID_REQUEST,
    "invalid_event": ErrorType.INVALID_REQUEST,
    "invalid_value": ErrorType.INVALID_REQUEST,
    "invalid_speech_style": ErrorType.INVALID_REQUEST,
    "unknown_parameter": ErrorType.INVALID_REQUEST,
    "unknown_event": ErrorType.INVALID_REQUEST,
    "unsupported_event": ErrorType.INVALID_REQUEST,
    "binary_frame_unsupported": ErrorType.INVALID_REQUEST,
    "frame_too_large": ErrorType.INVALID_REQUEST,
    "event_frame_too_large": ErrorType.INVALID_REQUEST,
    "tools_too_large": ErrorType.INVALID_REQUEST,
    "event_too_large": ErrorType.SERVER,
    "unsupported_session_type": ErrorType.INVALID_REQUEST,
    "unsupported_audio_format": ErrorType.INVALID_REQUEST,
    "unsupported_sample_rate": ErrorType.INVALID_REQUEST,
    "unsupported_turn_detection": ErrorType.INVALID_REQUEST,
    "unknown_voice": ErrorType.INVALID_REQUEST,
    "instructions_exceed_context": ErrorType.INVALID_REQUEST,
    "speech_style_too_long": ErrorType.INVALID_REQUEST,
    "token_limit_too_small": ErrorType.INVALID_REQUEST,
    "cannot_update_voice": ErrorType.INVALID_REQUEST,
    "unsupported_parameter": ErrorType.INVALID_REQUEST,
    "cannot_update_tracing": ErrorType.INVALID_REQUEST,
    "too_many_out_of_band_responses": ErrorType.INVALID_REQUEST,
    "invalid_audio": ErrorType.INVALID_REQUEST,
    "input_audio_buffer_commit_empty": ErrorType.INVALID_REQUEST,
    "input_audio_buffer_too_large": ErrorType.INVALID_REQUEST,
    "invalid_image": ErrorType.INVALID_REQUEST,
    "invalid_video": ErrorType.INVALID_REQUEST,
    "video_too_long": ErrorType.INVALID_REQUEST,
    "video_decoder_unavailable": ErrorType.INVALID_REQUEST,
    "unsupported_content": ErrorType.INVALID_REQUEST,
    "item_retrieve_invalid_item_id": ErrorType.INVALID_REQUEST,
    "item_delete_invalid_item_id": ErrorType.INVALID_REQUEST,
    "item_truncate_invalid_item_id": ErrorType.INVALID_REQUEST,
    "item_create_invalid_previous_item_id": ErrorType.INVALID_REQUEST,
    "duplicate_item_id": ErrorType.INVALID_REQUEST,
    "truncate_content_index_invalid": ErrorType.INVALID_REQUEST,
    "truncate_audio_end_ms_invalid": ErrorType.INVALID_REQUEST,
    "event_out_of_order": ErrorType.INVALID_REQUEST,
    "conversation_already_has_active_response": ErrorType.INVALID_REQUEST,
    "response_cancel_not_active": ErrorType.INVALID_REQUEST,
    "session_limit_reached": ErrorType.SERVER,
    "idle_timeout": ErrorType.INVALID_REQUEST,
    "server_error": ErrorType.SERVER,
    "engine_error": ErrorType.SERVER,
    "engine_unavailable": ErrorType.SERVER,
    "engine_overloaded": ErrorType.SERVER,
    "replica_lost": ErrorType.SERVER,
    "engine_admission_failed": ErrorType.SERVER,
    "engine_task_unavailable": ErrorType.SERVER,
    "invalid_prompt": ErrorType.INVALID_REQUEST,
    "server_shutting_down": ErrorType.SERVER,
    "invalid_text": ErrorType.INVALID_REQUEST,
    "nesting_too_deep": ErrorType.INVALID_REQUEST,
    "invalid_number": ErrorType.INVALID_REQUEST,
    "string_above_max_length": ErrorType.INVALID_REQUEST,
    "array_above_max_length": ErrorType.INVALID_REQUEST,
    "object_above_max_properties": ErrorType.INVALID_REQUEST,
    "json_value_too_large": ErrorType.INVALID_REQUEST,
    "image_too_large": ErrorType.INVALID_REQUEST,
    "image_too_small": ErrorType.INVALID_REQUEST,
    "image_aspect_ratio_too_large": ErrorType.INVALID_REQUEST,
    "image_rate_limited": ErrorType.INVALID_REQUEST,
    "video_rate_limited": ErrorType.INVALID_REQUEST,
    "input_audio_too_short": ErrorType.INVALID_REQUEST,
    "input_audio_too_long": ErrorType.INVALID_REQUEST,
    "input_text_too_long": ErrorType.INVALID_REQUEST,
    "item_too_large": ErrorType.INVALID_REQUEST,
    "context_length_exceeded": ErrorType.INVALID_REQUEST,
    "unsupported_noise_reduction": ErrorType.INVALID_REQUEST,
    "unsupported_transcription_model": ErrorType.INVALID_REQUEST,
    "transcription_failed": ErrorType.SERVER,
    "invalid_tool_call": ErrorType.SERVER,
    "tool_choice_unknown_function": ErrorType.INVALID_REQUEST,
    "mcp_tools_disabled": ErrorType.INVALID_REQUEST,
    "mcp_server_not_allowed": ErrorType.INVALID_REQUEST,
    "mcp_approval_request_not_found": ErrorType.INVALID_REQUEST,
    "mcp_list_tools_failed": ErrorType.SERVER,
    "output_audio_buffer_empty": ErrorType.INVALID_REQUEST,
    "realtime_only_parameter": ErrorType.INVALID_REQUEST,
    "transcription_session_no_response": ErrorType.INVALID_REQUEST,
    "session_type_change_while_responding": ErrorType.INVALID_REQUEST,
    "voice_not_found": ErrorType.INVALID_REQUEST,
}


def test_error_codes_are_frozen_api() -> None:
    """The ErrorCode values and their error types are exactly the published list (never renamed)."""
    assert {code.value: code.error_type for code in ErrorCode} == FROZEN_CODES


def test_error_messages_of_session_level_codes() -> None:
    """Codes raised by the session layer render the messages clients rely on (OpenAI wording where known)."""
    commit = ProtocolError(
        ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY, min_ms=100, buffered_ms=40.0, event_id="c"
    )
    assert commit.message == (
        "Error committing input audio buffer: buffer too small. Expected at least 100ms of audio,"
        " but buffer only has 40.00ms of audio."
    )
    assert commit.event_id == "c"
    active = ProtocolError(ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE, response_id="resp_1")
    assert active.message.startswith("Conversation already has an active response in progress: resp_1.")
    assert ProtocolError(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE).message == (
        "Cancellation failed: no active response found."
    )
    truncate = ProtocolError(
        ErrorCode.TRUNCATE_AUDIO_END_MS_INVALID,
        param="audio_end_ms",
        audio_end_ms=900,
        duration_ms=640,
        item_id="i",
    )
    assert truncate.message == "audio_end_ms 900 exceeds the 640 ms of audio in item 'i'."


def test_error_missing_template_value_raises() -> None:
    """Building an error without a value its template needs is a programming error (KeyError)."""
    with pytest.raises(KeyError):
        ProtocolError(ErrorCode.UNKNOWN_VOICE, voice="x")


def test_error_with_event_id_copies() -> None:
    """with_event_id returns a copy echoing the id and leaves the original untouched."""
    original = ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="x")
    echoed = original.with_event_id("e9")
    assert (echoed.code, echoed.param, echoed.message, echoed.event_id) == (
        original.code,
        "type",
        original.message,
        "e9",
    )
    assert original.event_id is None


def test_error_survives_pickling() -> None:
    """A frame parsed in the frame parser's process sends its error back pickled: every field comes back."""
    import pickle

    error = ProtocolError(ErrorCode.INVALID_EVENT, param="type", detail="x").with_event_id("e1")
    back = pickle.loads(pickle.dumps(error))
    assert (back.code, back.param, back.message, back.event_id, str(back)) == (
        error.code, error.param, error.message, error.event_id, str(error))


def _tools(count: int, description: str) -> list[dict[str, Any]]:
    return [{"type": "function", "name": f"t{i}", "description": description} for i in range(count)]


@pytest.mark.parametrize("dialect", [GA, BETA])
def test_large_frames_bounded_by_event_type_and_tools_size(dialect: Dialect) -> None:
    """Issue 43 finding 2: with a control-frame cap, a larger event that carries no media is refused
    (`event_frame_too_large` at `type`, the client's event_id echoed) before any value is checked; tools over
    1 MiB of JSON in all get `tools_too_large` at their param, in a frame of any size; media events are not capped."""
    update = json.dumps({"type": "session.update", "event_id": "u1", "session": {"instructions": "x" * 5000}})
    error = parse(update, dialect, control_max_bytes=4096)
    assert isinstance(error, ProtocolError)
    assert (error.code, error.param, error.event_id) == (ErrorCode.EVENT_FRAME_TOO_LARGE, "type", "u1")
    assert "'session.update' frame of" in error.message
    untyped = parse(json.dumps({"type": ["\ud800"], "x": "y" * 5000}), dialect, control_max_bytes=4096)
    assert isinstance(untyped, ProtocolError) and "untyped frame" in untyped.message
    append = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 2000})
    assert not isinstance(parse(append, dialect, control_max_bytes=4096), ProtocolError)
    big = _tools(128, "d" * 8192)  # each tool within its limits; over 1 MiB together
    for frame, param in [
        (json.dumps({"type": "response.create", "response": {"tools": big}}), "response.tools"),
        (json.dumps({"type": "session.update", "session": {"tools": big}}), "session.tools"),
        # under 1 MiB of characters, over 1 MiB of UTF-8: the decoder's own check
        (json.dumps({"type": "session.update", "session": {"tools": _tools(64, "é" * 8192)}}, ensure_ascii=False),
         "session.tools"),
    ]:
        error = parse(frame, dialect)
        assert isinstance(error, ProtocolError)
        assert (error.code, error.param) == (ErrorCode.TOOLS_TOO_LARGE, param)


@pytest.mark.parametrize(("frame", "event_id"), [
    ('{"type":"session.update","session":{"instructions":"%s"}}', None),
    ('{"type": "session.update", "event_id": "u2", "session": {"instructions": "%s"}}', "u2"),
    ('  {\n "event_id" : "u3" ,\t"type" : "session.update" , "session": {"instructions": "%s"}}', "u3"),
    ('{"type":"no.such.event","x":"%s"}', None),
    ('{"type":"conversation.item.delete","event_id":"u4","item_id":"%s"}', "u4"),
    ('{"type": "session.update", "session": {"instructions": "%s"}, "event_id": "u5"}', "u5"),  # the openai SDK's order
    ('{"event_id":"u6","type":"session.update","session":{"instructions":"%s"},"event_id":"u7"}\n', "u7"),  # the last
])
def test_leading_type_refusal_is_what_parse_answers(frame: str, event_id: str | None) -> None:
    """Issue 43: a frame over the control cap that opens with the type of an event carrying no media is refused
    from its first characters with exactly the error (code, param, message, echoed event_id) that decoding the
    whole frame gives, so the server need not decode it."""
    frame = frame % ("x" * 5000)
    early = refuse_by_leading_type(frame, 4096)
    full = parse(frame, GA, control_max_bytes=4096)
    assert isinstance(early, ProtocolError) and isinstance(full, ProtocolError)
    assert (early.code, early.param, early.message) == (full.code, full.param, full.message)
    assert early.code is ErrorCode.EVENT_FRAME_TOO_LARGE and early.event_id == full.event_id == event_id


_IMAGE = '{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}'


@pytest.mark.parametrize(("frame", "refused"), [
    ('{"type":"response.create","event_id":"r1","response":{"instructions":"%s"}}', True),  # refused undecoded
    ('{"response":{"instructions":"%s"},"type":"response.create","event_id":"r1"}', True),  # decoded: type not leading
    ('{"type":"response.create","event_id":"r1","response":{"instructions":"\\u0041%s"}}', True),  # decoded: escape
    ('{"type":"response.create","event_id":"r1","response":{"instructions":"%s","input":[' + _IMAGE + ']}}', False),
    ('{"type":"response.create","event_id":"r1","response":{"instructions":"%s","input":['
     + _IMAGE.replace('"image_url"', '"\\u0069mage_url"') + ']}}', False),  # an escaped key: decoded, found
    ('{"type":"conversation.item.create","event_id":"r1","item":{"type":"message","role":"user","content":['
     '{"type":"input_text","text":"%s"}]}}', False),  # an item: bounded by its parts' own limits
])
def test_a_response_create_over_the_control_cap_must_carry_media(frame: str, refused: bool) -> None:
    """Issue 43: a response.create over the control cap without audio, an image or video (tools, instructions,
    text) is refused as a control frame is (`event_frame_too_large` at `type`, event_id echoed), told from its text
    when it can be, else after decoding; one that carries media, written in any way JSON allows, is decoded."""
    frame = frame % ("x" * 5000)
    assert json.loads(frame)
    answer = parse(frame, GA, control_max_bytes=4096)
    if refused:
        assert isinstance(answer, ProtocolError)
        assert (answer.code, answer.param, answer.event_id) == (ErrorCode.EVENT_FRAME_TOO_LARGE, "type", "r1")
        assert "'response.create' frame of" in answer.message
    else:
        assert not isinstance(answer, ProtocolError), answer


@pytest.mark.parametrize("frame", [
    '{"type":"input_audio_buffer.append","audio":"%s"}',  # may carry media: decoded, not refused by its size
    '{"type":"response.create","response":{"instructions":"%s"}}',
    '{"session":{"instructions":"%s"},"type":"session.update"}',  # the type not leading: decoding decides
    '{"type":"sess\\u0069on.update","x":"%s"}',  # an escaped type: decoding decides
    '\u00a0{"type":"session.update","x":"%s"}',  # not JSON whitespace: decoding decides (invalid_json)
])
def test_leading_type_refusal_leaves_the_rest_to_parse(frame: str) -> None:
    assert refuse_by_leading_type(frame % ("A" * 5000), 4096) is None
    assert refuse_by_leading_type('{"type":"session.update","x":"%s"}' % ("A" * 4000), 4096) is None  # within the cap
