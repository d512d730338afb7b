"""`protocol.decode`: every server event the session emits, serialised in GA and beta and read back, is the
same typed event (up to the fields a dialect does not carry), and every frame validates against the
openai package's GA / beta server-event unions."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
from realtime_validate import validate_server_event
from protocol_samples_support import SAMPLES

from realtime_ming.protocol import (
    PLAYOUT_SERVER_TYPES,
    SERVER_EVENTS,
    TIMINGS_EVENT_TYPE,
    ConversationItemAdded,
    Dialect,
    ErrorCode,
    FunctionCallItem,
    InputAudio,
    MessageItem,
    ProtocolError,
    Response,
    ResponseDone,
    Role,
    ServerEvent,
    SessionUpdated,
    Usage,
    serialise,
)
from realtime_ming.protocol.audio_input import InputTranscription, NoiseReduction, NoiseReductionType, ServerVad
from realtime_ming.protocol.decode import decode_server_event
from realtime_ming.protocol.dialect import server_type_to_wire
from realtime_ming.protocol.session import DEFAULT_MODEL, SessionConfig
from realtime_ming.protocol.mcp import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallError,
    McpCallItem,
    McpListToolsItem,
    McpTool,
    McpToolFilter,
    McpToolInfo,
)
from realtime_ming.protocol.values import FunctionTool, ToolChoiceMode

RICH_SESSION = SessionConfig(
    model="tiny-ming",
    instructions="Be brief.",
    voice="DB30",
    speed=1.2,
    turn_detection=ServerVad(threshold=0.6, silence_duration_ms=300, create_response=False),
    transcription=InputTranscription(model="tiny-ming", language="en", prompt="names: Ada"),
    noise_reduction=NoiseReduction(NoiseReductionType.FAR_FIELD, 0.5),
    tools=(FunctionTool(name="get_weather", description="Weather.", parameters={"type": "object", "properties": {}}),),
    tool_choice=ToolChoiceMode.REQUIRED,
    max_output_tokens=300,
    temperature=0.0,  # the server may run greedy, below the client-settable range
    tracing="auto",
    truncation={"type": "retention_ratio", "retention_ratio": 0.5},
    timing_events=True,
)
EXTRA: list[ServerEvent] = [
    SessionUpdated(session=RICH_SESSION),
    ResponseDone(response=Response(id="resp_9", voice="DB30", usage=Usage(input_cached_audio_tokens=7),
                                   output=(FunctionCallItem(name="f", arguments="{}", call_id="c", id="i"),),
                                   temperature=0.0)),
    ConversationItemAdded(item=MessageItem(role=Role.USER, content=(InputAudio(transcript=None),), id="item_u")),
]
# Remote MCP tools are GA only: their items and events exist on GA connections alone.
MCP_EVENTS: list[ServerEvent] = [
    ConversationItemAdded(item=McpListToolsItem(id="item_l", server_label="w", tools=(McpToolInfo(
        "a", {"type": "object"}, "A tool.", {"readOnlyHint": True}),))),
    ConversationItemAdded(item=McpCallItem(id="item_c", server_label="w", name="a", arguments="{}", output="ok",
                                           approval_request_id="item_r")),
    ConversationItemAdded(item=McpCallItem(id="item_e", server_label="w", name="a", arguments="{}",
                                           error=McpCallError("http_error", "503", 503))),
    ConversationItemAdded(item=McpApprovalRequestItem(id="item_r", server_label="w", name="a", arguments="{}")),
    ConversationItemAdded(item=McpApprovalResponseItem(id="item_p", approval_request_id="item_r", approve=True)),
]
EVENTS = [event for events in SAMPLES.values() for event in events] + EXTRA
CASES = [(dialect, event) for dialect in Dialect for event in EVENTS] + [(Dialect.GA, e) for e in MCP_EVENTS]


def _projected(event: ServerEvent, dialect: Dialect) -> ServerEvent:
    """`event` as `dialect` can carry it: GA responses have no temperature; beta sessions no model,
    idle timeout, truncation, include or prompt; GA sessions no temperature."""
    values = {}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, Response) and dialect is Dialect.GA:
            value = replace(value, temperature=None)
        if isinstance(value, SessionConfig):
            default = SessionConfig(id=value.id)
            if dialect is Dialect.GA:
                value = replace(value, temperature=default.temperature)
            else:
                td = value.turn_detection
                value = replace(value, model=DEFAULT_MODEL, truncation=default.truncation, include=None, prompt=None,
                                turn_detection=replace(td, idle_timeout_ms=None) if isinstance(td, ServerVad) else td)
        values[f.name] = value
    return type(event)(**values)


@pytest.mark.parametrize(("dialect", "event"), CASES, ids=[f"{d.value}-{e.type}-{i}" for i, (d, e) in enumerate(CASES)])
def test_every_server_event_round_trips_and_validates(dialect: Dialect, event: ServerEvent) -> None:
    timings = event.type == TIMINGS_EVENT_TYPE
    playout = event.type in PLAYOUT_SERVER_TYPES
    if playout and dialect is Dialect.BETA:  # WebRTC calls speak GA only
        with pytest.raises(ValueError):
            serialise(event, dialect, playout=True)
        return
    frame = serialise(event, dialect, timing_events=timings, playout=playout)
    if frame is None:  # beta has no conversation.item.done, no idle timeout
        assert server_type_to_wire(event.type, dialect) is None
        return
    validate_server_event(frame, dialect, allow_timings=timings, allow_opt_in=True, allow_playout=playout)
    decoded = decode_server_event(frame, dialect)
    assert type(decoded) is type(event)
    assert decoded == _projected(event, dialect)
    # Reading is the exact inverse of writing: the decoded event serialises to the same body.
    again = json.loads(serialise(decoded, dialect, timing_events=timings, playout=playout))
    original = json.loads(frame)
    assert {k: v for k, v in again.items() if k != "event_id"} == {k: v for k, v in original.items() if k != "event_id"}


def test_ga_session_with_an_mcp_tool_round_trips_and_validates() -> None:
    """An MCP tool is echoed in the GA session (its headers and token left out) and read back."""
    tool = McpTool(server_label="w", server_url="http://127.0.0.1:1/mcp", allowed_tools=McpToolFilter(("a",)),
                   require_approval="never", headers={"X-Key": "secret"})
    frame = serialise(SessionUpdated(session=SessionConfig(tools=(tool,))), Dialect.GA)
    validate_server_event(frame, Dialect.GA)
    assert "secret" not in frame
    decoded = decode_server_event(frame, Dialect.GA)
    assert decoded.session.tools == (replace(tool, headers={}),)


def test_every_registered_server_event_is_covered() -> None:
    assert {type(event) for event in EVENTS + MCP_EVENTS} == set(SERVER_EVENTS.values())


def test_decode_maps_beta_names_and_refuses_foreign_ones() -> None:
    frame = {"type": "response.audio.delta", "response_id": "r", "item_id": "i", "output_index": 0,
             "content_index": 0, "delta": "AAAA"}
    assert decode_server_event(frame, Dialect.BETA).type == "response.output_audio.delta"
    with pytest.raises(ProtocolError) as info:
        decode_server_event(frame, Dialect.GA)
    assert info.value.code is ErrorCode.UNKNOWN_EVENT


_ITEM_ADDED = '{"type": "response.output_item.added", "response_id": "r", "output_index": 0, "item": %s}'
_DONE_WITH_USAGE = '{"type": "response.done", "response": {"id": "r", "audio": {"output": {"voice": "v"}}, "usage": %s}}'


@pytest.mark.parametrize(("frame", "code", "param"), [
    ("{oops", ErrorCode.INVALID_JSON, None),
    ('{"type": "conversation.item.deleted"}', ErrorCode.INVALID_EVENT, "item_id"),
    ('{"type": "conversation.item.deleted", "item_id": 3}', ErrorCode.INVALID_EVENT, "item_id"),
    (_ITEM_ADDED % '{"type": "message", "role": "robot", "content": []}', ErrorCode.INVALID_VALUE, "item.role"),
    (_ITEM_ADDED % '{"type": "web_search", "id": "x"}', ErrorCode.INVALID_VALUE, "item.type"),
    ('{"type": "response.done", "response": {"id": "r", "status": "done", "audio": {"output": {"voice": "v"}}}}',
     ErrorCode.INVALID_VALUE, "response.status"),
    (_DONE_WITH_USAGE % '{"input_token_details": {"text_tokens": -1}}', ErrorCode.INVALID_VALUE, "response.usage.input_token_details.text_tokens"),
])
def test_decode_names_the_bad_field(frame: str, code: ErrorCode, param: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_server_event(frame)
    assert info.value.code is code
    assert info.value.param == param
