"""Server events: registry walk, SDK-union validation in GA and beta, dialect names, serialise guards."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from realtime_validate import validate_server_event

from realtime_ming import protocol
from realtime_ming.protocol import (
    CLIENT_EVENTS,
    GA_CLIENT_SAFE_SERVER_TYPES,
    GA_OPT_IN_SERVER_TYPES,
    PLAYOUT_SERVER_TYPES,
    SERVER_EVENTS,
    TIMINGS_EVENT_TYPE,
    ConversationItemAdded,
    ConversationItemDone,
    Dialect,
    Error,
    ErrorCode,
    IdPrefix,
    InputAudioBufferCleared,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    ProtocolError,
    RealtimeMingResponseTimings,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputItemDone,
    ServerEvent,
    event_to_wire,
    new_id,
    serialise,
)
from realtime_ming.protocol.events import class_name_for, register
from realtime_ming.protocol.mcp_events import MCP_SERVER_TYPES

from protocol_samples_support import ALL_SAMPLES, PNG, RESP, SAMPLES, USER_IMAGE

SDK_SAMPLES = [(name, event) for name, event in ALL_SAMPLES if name != TIMINGS_EVENT_TYPE]
WEBSOCKET_SAMPLES = [(name, event) for name, event in SDK_SAMPLES if name not in PLAYOUT_SERVER_TYPES]


def test_registry_every_server_event_has_samples() -> None:
    """Every registered server event class has at least one realistic sample in this file."""
    assert set(SAMPLES) == set(SERVER_EVENTS.values())


def test_registry_class_names_are_camel_case_of_wire_names() -> None:
    """Each registered class is named the CamelCase of its GA wire type."""
    for wire_type, cls in {**CLIENT_EVENTS, **SERVER_EVENTS}.items():
        assert cls.__name__ == class_name_for(wire_type)
    assert class_name_for("response.output_audio.delta") == "ResponseOutputAudioDelta"


def test_registry_ga_types_are_pipecat_types_plus_timings() -> None:
    """The server events are exactly pipecat's 31 GA types plus our timings extension, the
    opt-in GA events (idle_timeout_ms's timeout_triggered) and the WebRTC playout events."""
    assert len(GA_CLIENT_SAFE_SERVER_TYPES) == 31
    assert GA_OPT_IN_SERVER_TYPES == {"input_audio_buffer.timeout_triggered"} | MCP_SERVER_TYPES
    assert PLAYOUT_SERVER_TYPES == {f"output_audio_buffer.{s}" for s in ("started", "stopped", "cleared")}
    assert set(SERVER_EVENTS) == (GA_CLIENT_SAFE_SERVER_TYPES | GA_OPT_IN_SERVER_TYPES | PLAYOUT_SERVER_TYPES
                                  | {TIMINGS_EVENT_TYPE})


@pytest.mark.parametrize(("name", "event"), SDK_SAMPLES, ids=[n for n, _ in SDK_SAMPLES])
def test_serialise_ga_validates_against_sdk(name: str, event: ServerEvent) -> None:
    """Every GA frame validates strictly as openai.types.realtime.RealtimeServerEvent and keeps its name."""
    playout = name in PLAYOUT_SERVER_TYPES
    frame = serialise(event, Dialect.GA, playout=playout)
    assert frame is not None
    validate_server_event(frame, Dialect.GA, allow_opt_in=name in GA_OPT_IN_SERVER_TYPES, allow_playout=playout)
    assert json.loads(frame)["type"] == name


@pytest.mark.parametrize("event", [e for cls in (OutputAudioBufferStarted, OutputAudioBufferStopped,
                                                   OutputAudioBufferCleared) for e in SAMPLES[cls]])
def test_playout_events_only_where_the_transport_plays_out(event: ServerEvent) -> None:
    """`output_audio_buffer.*` go to a GA transport that owns the playout (WebRTC) and nowhere else: a WebSocket
    connection (GA or beta) never gets them, even by mistake."""
    for dialect in Dialect:
        with pytest.raises(ValueError, match="playout"):
            serialise(event, dialect)
    with pytest.raises(ValueError, match="playout"):
        serialise(event, Dialect.BETA, playout=True)
    with pytest.raises(AssertionError):
        validate_server_event(serialise(event, Dialect.GA, playout=True), Dialect.GA)


@pytest.mark.parametrize(("name", "event"), WEBSOCKET_SAMPLES, ids=[n for n, _ in WEBSOCKET_SAMPLES])
def test_serialise_beta_validates_against_sdk(name: str, event: ServerEvent) -> None:
    """Every beta frame validates strictly as openai.types.beta.realtime.RealtimeServerEvent."""
    frame = serialise(event, Dialect.BETA)
    if name in ("conversation.item.done", "input_audio_buffer.timeout_triggered", *MCP_SERVER_TYPES):
        assert frame is None
        return
    assert frame is not None
    validate_server_event(frame, Dialect.BETA)


def test_serialise_ga_image_item_validates() -> None:
    """A user image item renders as GA input_image and validates."""
    wire = event_to_wire(ConversationItemAdded(item=USER_IMAGE), Dialect.GA)
    assert wire is not None
    validate_server_event(wire, Dialect.GA)
    assert wire["item"]["content"] == [{"type": "input_image", "image_url": PNG}]


def test_serialise_beta_renames_events() -> None:
    """Beta connections get beta names; conversation.item.added becomes conversation.item.created."""
    expected = {
        "conversation.item.added": "conversation.item.created",
        "response.output_text.delta": "response.text.delta",
        "response.output_text.done": "response.text.done",
        "response.output_audio.delta": "response.audio.delta",
        "response.output_audio.done": "response.audio.done",
        "response.output_audio_transcript.delta": "response.audio_transcript.delta",
        "response.output_audio_transcript.done": "response.audio_transcript.done",
        "response.done": "response.done",
    }
    for ga_name, beta_name in expected.items():
        event = SAMPLES[SERVER_EVENTS[ga_name]][0]
        wire = event_to_wire(event, Dialect.BETA)
        assert wire is not None and wire["type"] == beta_name


def test_serialise_beta_drops_item_done() -> None:
    """conversation.item.done has no beta form: serialise returns None."""
    assert serialise(SAMPLES[ConversationItemDone][0], Dialect.BETA) is None


def test_serialise_content_names_follow_dialect() -> None:
    """Assistant item content is output_audio in GA and audio in beta; content-part events use audio in both."""
    done = SAMPLES[ResponseOutputItemDone][0]
    part = SAMPLES[ResponseContentPartDone][0]
    for dialect, item_type in ((Dialect.GA, "output_audio"), (Dialect.BETA, "audio")):
        item_wire, part_wire = event_to_wire(done, dialect), event_to_wire(part, dialect)
        assert item_wire is not None and part_wire is not None
        assert item_wire["item"]["content"] == [{"type": item_type, "transcript": "It is sunny."}]
        assert part_wire["part"] == {"type": "audio", "transcript": "It is sunny."}


def test_serialise_event_ids_are_fresh() -> None:
    """Each serialise call stamps a new unique event_id with the event_ prefix."""
    event = SAMPLES[InputAudioBufferCleared][0]
    ids = {json.loads(serialise(event, Dialect.GA) or "")["event_id"] for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("event_") for i in ids)


def test_serialise_error_echoes_client_event_id() -> None:
    """An error frame carries type, code, message, param and the client's event_id."""
    error = ProtocolError(ErrorCode.UNKNOWN_EVENT, param="type", event_type="foo.bar", event_id="client_7")
    wire = event_to_wire(Error.from_protocol_error(error), Dialect.GA)
    assert wire is not None
    assert wire["error"] == {
        "type": "invalid_request_error",
        "code": "unknown_event",
        "message": "Unknown event type 'foo.bar'.",
        "param": "type",
        "event_id": "client_7",
    }
    assert wire["event_id"] != "client_7"


def test_serialise_response_carries_pipecat_required_keys() -> None:
    """response.created / response.done always carry id, object, status, status_details and output."""
    for event in (SAMPLES[ResponseCreated][0], SAMPLES[ResponseDone][0]):
        for dialect in Dialect:
            wire = event_to_wire(event, dialect)
            assert wire is not None
            assert {"id", "object", "status", "status_details", "output"} <= wire["response"].keys()
            assert wire["response"]["object"] == "realtime.response"
    done = event_to_wire(SAMPLES[ResponseDone][0], Dialect.GA)
    assert done is not None
    assert done["response"]["status_details"] == {
        "type": "cancelled",
        "reason": "turn_detected",
        "error": None,
    }
    assert done["response"]["usage"]["total_tokens"] == 87


def test_serialise_timings_requires_opt_in() -> None:
    """The timings extension is refused without the opt-in and well-formed with it, in both dialects."""
    event = SAMPLES[RealtimeMingResponseTimings][0]
    for dialect in Dialect:
        with pytest.raises(ValueError, match="timing_events opt-in"):
            serialise(event, dialect)
        frame = serialise(event, dialect, timing_events=True)
        assert frame is not None
        validate_server_event(frame, dialect, allow_timings=True)
        with pytest.raises(AssertionError):
            validate_server_event(frame, dialect)
        assert json.loads(frame)["timings"] == {"speech_stopped": 0.0, "first_audio": 212.5}


def test_serialise_refuses_unregistered_event() -> None:
    """serialise raises for a ServerEvent subclass that is not in the registry."""

    @dataclass(frozen=True, slots=True, kw_only=True)
    class OutputAudioBufferStarted(ServerEvent):
        type: ClassVar[str] = "output_audio_buffer.started"
        response_id: str

    with pytest.raises(ValueError, match="not a registered server event"):
        serialise(OutputAudioBufferStarted(response_id=RESP), Dialect.GA)


def test_validator_rejects_non_pipecat_ga_type() -> None:
    """The shared validator rejects SDK-valid GA events outside pipecat's 31 (conversation.item.created)."""
    frame = {"type": "conversation.item.created", "event_id": "event_1", "item": {"type": "message"}}
    with pytest.raises(AssertionError, match="pipecat"):
        validate_server_event(frame, Dialect.GA)


def test_validator_rejects_beta_names_on_ga() -> None:
    """A beta-named frame fails GA validation and a GA-named frame fails beta validation."""
    beta = event_to_wire(SAMPLES[ResponseOutputAudioDelta][0], Dialect.BETA)
    ga = event_to_wire(SAMPLES[ResponseOutputAudioDelta][0], Dialect.GA)
    with pytest.raises(AssertionError):
        validate_server_event(beta or {}, Dialect.GA)
    with pytest.raises(Exception, match="validation error"):
        validate_server_event(ga or {}, Dialect.BETA)


def test_register_rejects_misnamed_and_duplicate_classes() -> None:
    """register refuses a class whose name does not match its type, and a second class for a type."""
    with pytest.raises(TypeError, match="must be named ResponseDone"):

        @register
        @dataclass(frozen=True, slots=True, kw_only=True)
        class Finished(ServerEvent):
            type: ClassVar[str] = "response.done"

    with pytest.raises(TypeError, match="already registered"):

        @register
        @dataclass(frozen=True, slots=True, kw_only=True)
        class ResponseDone(ServerEvent):
            type: ClassVar[str] = "response.done"

    assert SERVER_EVENTS["response.done"].__module__ == "realtime_ming.protocol.server_events"


def test_ids_are_prefixed_and_unique() -> None:
    """new_id returns distinct ids starting with each family's prefix."""
    for prefix in IdPrefix:
        ids = {new_id(prefix) for _ in range(50)}
        assert len(ids) == 50 and all(i.startswith(prefix.value) for i in ids)
    assert [p.value for p in IdPrefix] == ["event_", "sess_", "item_", "resp_", "conv_", "call_"]


def test_protocol_imports_only_stdlib_and_itself() -> None:
    """protocol/ imports no asyncio, torch or other realtime_ming package."""
    allowed = {
        "__future__",
        "collections",
        "dataclasses",
        "difflib",
        "enum",
        "functools",
        "importlib",
        "json",
        "math",
        "re",
        "secrets",
        "types",
        "typing",
    }
    package = Path(protocol.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.startswith("realtime_ming.protocol") or name.split(".")[0] in allowed, (
                    path.name,
                    name,
                )
