"""Client events: real client JSON parses to the expected typed event and round-trips; bad frames
give stable error codes and param paths; no mutated frame makes `parse` raise."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from openai.types.beta.realtime import RealtimeClientEvent as BetaClientEvent
from openai.types.realtime import RealtimeClientEvent as GaClientEvent
from pydantic import TypeAdapter

from realtime_ming.protocol import (
    CLIENT_EVENTS,
    AudioFormat,
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    ConversationMode,
    Dialect,
    Eagerness,
    ErrorCode,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    ImageDetail,
    InputAudio,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    InputImage,
    InputText,
    InputTranscription,
    ItemReference,
    MessageItem,
    Modality,
    NoiseReduction,
    NoiseReductionType,
    OutputAudioBufferClear,
    OutputText,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    Role,
    SemanticVad,
    ServerVad,
    SessionPatch,
    SessionUpdate,
    ToolChoiceMode,
    TranscriptionSessionUpdate,
    parse,
)
from realtime_ming.protocol.session import SessionType

SDK_CLIENT_UNIONS = {Dialect.GA: TypeAdapter(GaClientEvent), Dialect.BETA: TypeAdapter(BetaClientEvent)}
PNG = "data:image/png;base64,iVBORw0KGgo="
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_WIRE = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather by city",
    "parameters": SCHEMA,
}
TOOL = FunctionTool("get_weather", "Weather by city", SCHEMA)
USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}

GA_SESSION = {
    "type": "realtime",
    "model": "gpt-realtime",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "noise_reduction": {"type": "near_field"},
            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
            "turn_detection": {"type": "semantic_vad", "eagerness": "high", "interrupt_response": True},
        },
        "output": {"format": {"type": "audio/pcmu"}, "voice": "ash", "speed": 1.1},
    },
    "tools": [TOOL_WIRE],
    "tool_choice": "auto",
    "max_output_tokens": 512,
    "tracing": "auto",
    "truncation": "auto",
    "include": [],  # logprobs and stored prompts are refused: test_protocol_support.py
    "prompt": None,
    "realtime_ming": {"timing_events": True},
}
GA_SESSION_CHANGES = {
    "model": "gpt-realtime",
    "instructions": "Be brief.",
    "output_modalities": (Modality.AUDIO,),
    "input_format": AudioFormat(),
    "noise_reduction": NoiseReduction(NoiseReductionType.NEAR_FIELD),
    "transcription": InputTranscription(model="gpt-4o-mini-transcribe", language="en"),
    "turn_detection": SemanticVad(eagerness=Eagerness.HIGH),
    "output_format": AudioFormat.pcmu(),
    "voice": "ash",
    "speed": 1.1,
    "tools": (TOOL,),
    "tool_choice": ToolChoiceMode.AUTO,
    "max_output_tokens": 512,
    "tracing": "auto",
    "truncation": "auto",
    "include": (),
    "prompt": None,
    "timing_events": True,
    "session_type": SessionType.REALTIME,
}
BETA_SESSION = {
    "model": "gpt-4o-realtime-preview",
    "modalities": ["text", "audio"],
    "instructions": "Be brief.",
    "voice": "alloy",
    "input_audio_format": "g711_alaw",
    "output_audio_format": "pcm16",
    "input_audio_transcription": {"model": "whisper-1"},
    "input_audio_noise_reduction": {"type": "far_field"},
    "turn_detection": {
        "type": "server_vad",
        "threshold": 0.6,
        "prefix_padding_ms": 200,
        "silence_duration_ms": 300,
        "create_response": False,
        "interrupt_response": False,
    },
    "tools": [TOOL_WIRE],
    "tool_choice": "get_weather",
    "temperature": 0.7,
    "max_response_output_tokens": 256,
    "speed": 0.9,
}
BETA_SESSION_CHANGES = {
    "model": "gpt-4o-realtime-preview",
    "output_modalities": (Modality.AUDIO,),
    "instructions": "Be brief.",
    "voice": "alloy",
    "input_format": AudioFormat.pcma(),
    "output_format": AudioFormat(),
    "transcription": InputTranscription(model="whisper-1"),
    "noise_reduction": NoiseReduction(NoiseReductionType.FAR_FIELD),
    "turn_detection": ServerVad(
        threshold=0.6,
        prefix_padding_ms=200,
        silence_duration_ms=300,
        create_response=False,
        interrupt_response=False,
    ),
    "tools": (TOOL,),
    "tool_choice": FunctionChoice("get_weather"),
    "temperature": 0.7,
    "max_output_tokens": 256,
    "speed": 0.9,
}

# (dialect, client JSON as a real client sends it, the typed event it must parse to)
CASES: list[tuple[Dialect, dict[str, Any], ClientEvent]] = [
    (
        Dialect.GA,
        {"type": "session.update", "event_id": "c1", "session": GA_SESSION},
        SessionUpdate(event_id="c1", session=SessionPatch(GA_SESSION_CHANGES, Dialect.GA)),
    ),
    (
        Dialect.BETA,
        {"type": "session.update", "session": BETA_SESSION},
        SessionUpdate(session=SessionPatch(BETA_SESSION_CHANGES, Dialect.BETA)),
    ),
    (
        Dialect.GA,
        {"type": "input_audio_buffer.append", "audio": "AAAA"},
        InputAudioBufferAppend(audio="AAAA"),
    ),
    (
        Dialect.GA,
        {"type": "input_audio_buffer.commit", "event_id": "c2"},
        InputAudioBufferCommit(event_id="c2"),
    ),
    (Dialect.BETA, {"type": "input_audio_buffer.clear"}, InputAudioBufferClear()),
    (
        Dialect.GA,
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_audio", "audio": "AAAA", "transcript": "what is this"},
                    {"type": "input_image", "image_url": PNG, "detail": "low"},
                ],
            },
        },
        ConversationItemCreate(
            previous_item_id="root",
            item=MessageItem(
                role=Role.USER,
                content=(
                    InputText("What is this?"),
                    InputAudio(audio="AAAA", transcript="what is this"),
                    InputImage(PNG, ImageDetail.LOW),
                ),
            ),
        ),
    ),
    (
        Dialect.BETA,
        {
            "type": "conversation.item.create",
            "item": {"id": "item_a", "role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        },
        ConversationItemCreate(
            item=MessageItem(id="item_a", role=Role.ASSISTANT, content=(OutputText("Hello."),)),
        ),
    ),
    (
        Dialect.GA,
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": '{"sky":"clear"}'},
        },
        ConversationItemCreate(item=FunctionCallOutputItem(call_id="call_1", output='{"sky":"clear"}')),
    ),
    (
        Dialect.GA,
        {"type": "conversation.item.retrieve", "event_id": "c3", "item_id": "item_1"},
        ConversationItemRetrieve(event_id="c3", item_id="item_1"),
    ),
    (
        Dialect.GA,
        {"type": "conversation.item.truncate", "item_id": "item_2", "content_index": 0, "audio_end_ms": 1500},
        ConversationItemTruncate(item_id="item_2", content_index=0, audio_end_ms=1500),
    ),
    (
        Dialect.BETA,
        {"type": "conversation.item.delete", "item_id": "item_2"},
        ConversationItemDelete(item_id="item_2"),
    ),
    (Dialect.GA, {"type": "response.create"}, ResponseCreate()),
    (
        Dialect.GA,
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "instructions": "Answer in French.",
                "output_modalities": ["text"],
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}},
                "tools": [TOOL_WIRE],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": "inf",
                "metadata": {"topic": "weather"},
                "input": [USER_TEXT],
            },
        },
        ResponseCreate(
            response=ResponseParams(
                conversation=ConversationMode.NONE,
                instructions="Answer in French.",
                output_modalities=(Modality.TEXT,),
                output_format=AudioFormat(),
                voice="marin",
                tools=(TOOL,),
                tool_choice=FunctionChoice("get_weather"),
                max_output_tokens="inf",
                metadata={"topic": "weather"},
                input=(MessageItem(role=Role.USER, content=(InputText("hi"),)),),
            )
        ),
    ),
    (
        Dialect.BETA,
        {
            "type": "response.create",
            "response": {
                "modalities": ["text", "audio"],
                "voice": "alloy",
                "output_audio_format": "g711_ulaw",
                "temperature": 1.0,
                "max_response_output_tokens": 100,
                "tool_choice": "none",
                "conversation": "auto",
            },
        },
        ResponseCreate(
            response=ResponseParams(
                output_modalities=(Modality.AUDIO,),
                voice="alloy",
                output_format=AudioFormat.pcmu(),
                temperature=1.0,
                max_output_tokens=100,
                tool_choice=ToolChoiceMode.NONE,
            )
        ),
    ),
    (Dialect.GA, {"type": "response.cancel", "response_id": "resp_1"}, ResponseCancel(response_id="resp_1")),
    (Dialect.BETA, {"type": "response.cancel"}, ResponseCancel()),
    (Dialect.GA, {"type": "output_audio_buffer.clear"}, OutputAudioBufferClear()),
    (
        Dialect.BETA,
        {"type": "transcription_session.update", "session": {"input_audio_format": "pcm16"}},
        TranscriptionSessionUpdate(),
    ),
]
CASE_IDS = [f"{dialect}-{wire['type']}-{i}" for i, (dialect, wire, _) in enumerate(CASES)]


def test_cases_cover_every_client_event() -> None:
    """The fixture list exercises every registered client event class."""
    assert {type(expected) for _, _, expected in CASES} == set(CLIENT_EVENTS.values())


@pytest.mark.parametrize(("dialect", "wire", "expected"), CASES, ids=CASE_IDS)
def test_parse_client_json_gives_typed_event(
    dialect: Dialect, wire: dict[str, Any], expected: ClientEvent
) -> None:
    """SDK-valid client JSON parses to exactly the expected typed event."""
    SDK_CLIENT_UNIONS[dialect].validate_python(wire)  # the fixture is real client JSON
    assert parse(json.dumps(wire), dialect) == expected


@pytest.mark.parametrize(("dialect", "wire", "expected"), CASES, ids=CASE_IDS)
def test_parse_round_trips_to_wire(dialect: Dialect, wire: dict[str, Any], expected: ClientEvent) -> None:
    """A parsed event re-encoded with to_wire is SDK-valid client JSON and parses back equal."""
    encoded = expected.to_wire(dialect)
    SDK_CLIENT_UNIONS[dialect].validate_python(encoded)
    assert parse(json.dumps(encoded), dialect) == expected


def test_parse_accepts_both_content_spellings() -> None:
    """Assistant content parses from GA output_text and beta text on either connection."""
    for dialect in Dialect:
        for spelling in ("output_text", "text"):
            frame = {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": spelling, "text": "ok"}],
                },
            }
            event = parse(json.dumps(frame), dialect)
            assert isinstance(event, ConversationItemCreate)
            assert event.item == MessageItem(role=Role.ASSISTANT, content=(OutputText("ok"),))


def test_parse_response_input_accepts_item_references() -> None:
    """response.create input may reference existing items (SDK ResponseCreateEventWithReferencesParam)."""
    frame = {
        "type": "response.create",
        "response": {"input": [{"type": "item_reference", "id": "item_1"}, USER_TEXT]},
    }
    expected = ResponseCreate(
        response=ResponseParams(
            input=(ItemReference("item_1"), MessageItem(role=Role.USER, content=(InputText("hi"),)))
        )
    )
    for dialect in Dialect:
        assert parse(json.dumps(frame), dialect) == expected
        assert parse(json.dumps(expected.to_wire(dialect)), dialect) == expected


def test_parse_integral_float_is_accepted_as_int() -> None:
    """JSON numbers like 1500.0 are accepted where integers are expected (some clients send floats)."""
    frame = (
        '{"type": "conversation.item.truncate", "item_id": "i", "content_index": 0.0, "audio_end_ms": 1500.0}'
    )
    assert parse(frame, Dialect.GA) == ConversationItemTruncate(
        item_id="i", content_index=0, audio_end_ms=1500
    )


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in children:
        found.extend(_paths(child, (*path, key)))
    return found


def _replaced(wire: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(wire)
    parent = mutated
    for key in path[:-1]:
        parent = parent[key]
    if new is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return mutated


_DELETE = object()
_REPLACEMENTS = (None, 0, -1, 2.5, True, "", "x", [], {}, [1], {"type": 1}, _DELETE)


@pytest.mark.parametrize(("dialect", "wire", "expected"), CASES, ids=CASE_IDS)
def test_parse_never_raises_on_mutated_frames(
    dialect: Dialect, wire: dict[str, Any], expected: ClientEvent
) -> None:
    """Replacing or deleting any value of a valid frame yields an event or a ProtocolError, never an exception."""
    for path in _paths(wire):
        for new in _REPLACEMENTS:
            result = parse(json.dumps(_replaced(wire, path, new)), dialect)
            assert isinstance(result, ClientEvent | ProtocolError)
            if isinstance(result, ProtocolError):
                assert result.code in ErrorCode and result.message
