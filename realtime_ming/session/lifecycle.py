"""The response lifecycle of a `Session`: creating, finishing and cancelling responses.

Covers the default conversation's one active response and the out-of-band responses beside it:
`response.create` / `response.cancel`, the engine request a response submits, the engine events
that drive it to `response.done`, and the cleanup after a failed turn or a failed handler. Plain
functions of the session, which owns the state they read and write.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ..engine.api import (
    OUTPUT_SAMPLE_RATE_HZ,
    AudioChunk,
    FinishReason,
    Message,
    SamplingParams,
    StageMark,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    Truncation,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnRequest,
)
from ..protocol import client_events as ce
from ..protocol.errors import ErrorCode, ErrorType, ProtocolError
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import FunctionCallItem, ItemReference
from ..protocol.responses import ErrorDetail, ResponseStatus, StatusReason
from ..protocol.server_events import ConversationItemDeleted
from ..protocol.session import ServerVad
from ..protocol.values import ToolChoiceMode
from .actions import Action, CancelTurn, Send, SubmitTurn
from .conversation import AssistantItem, merge_calls
from .failures import log_failure
from .prompt_limits import talker_caption
from .response import ActiveResponse, ResponseSpec, failure_error
from .mcp import check_mcp_tools
from .tools import check_tool_choice, engine_tools, forces_call, response_tools
from .tracing import trace_response
from .usage import usage_of

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "abort_response",
    "cancel_response",
    "drop_responses_since",
    "finish_or_wait",
    "finish_response",
    "follow_up",
    "on_engine_event",
    "on_response_cancel",
    "on_response_create",
    "spec_for",
    "start_response",
    "turn_request",
]

# The session's logger: its log lines keep the name they have always had.
log = logging.getLogger(__package__ + ".session")

# Follow-up responses in a row that may call MCP tools again: past it, a response's calls still run but the
# server creates no further response (a model that calls tools forever is stopped).
MAX_FOLLOW_UPS = 8


# ---- client events ---------------------------------------------------------------------------
def on_response_create(session: Session, event: ce.ResponseCreate, now: float) -> list[Action]:
    session._admit_media(event, now)  # first, as `predecode` charges before it decodes
    params = event.response
    oob = params.conversation is ce.ConversationMode.NONE
    if oob and len(session._oob) >= session.settings.max_out_of_band_responses:
        return session._error(ErrorCode.TOO_MANY_OUT_OF_BAND_RESPONSES, event.event_id, param="response.conversation",
                              active=len(session._oob), limit=session.settings.max_out_of_band_responses)
    if not oob and session._response is not None:
        return session._error(
            ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE, event.event_id, response_id=session._response.id
        )
    session._accepted_voices.check(params.voice or session.config.voice, "response.voice", event.event_id)
    check_tool_choice(*response_tools(session.config, params), "response.tool_choice")
    session.prompt_limits.check_response(session.config, params, session.dialect)
    if params.tools is not None:
        check_mcp_tools(params.tools, session.mcp_allowed_hosts, "response.tools")
    # a server named here first is listed now; this response offers only tools already listed
    listing = [] if params.tools is None else session.mcp.list_new(params.tools)
    history = None if params.input is None else _history_from(session, params.input)
    # An out-of-band response leaves the conversation as it is: a speculative turn stays valid.
    actions = [] if oob else session._discard_speculation()
    return listing + actions + start_response(session, now, params=params, history=history)


def _history_from(session: Session, items) -> tuple[Message, ...]:
    """Engine messages for `response.create` `input` (references and inline items)."""
    messages = []
    for i, item in enumerate(items):
        if isinstance(item, ItemReference):
            entry = session.conversation.get(item.id)
            if entry is None:
                raise ProtocolError(
                    ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, param=f"response.input[{i}].id", item_id=item.id
                )
        else:
            entry = session._store_item(item, f"response.input[{i}]")
        messages.append(entry.message())
    return merge_calls(messages)


def on_response_cancel(session: Session, event: ce.ResponseCancel, now: float) -> list[Action]:
    if event.response_id in session._oob:
        turn_id = event.response_id
        return [CancelTurn(turn_id)] + finish_response(
            session, ResponseStatus.CANCELLED, now, response=session._oob[turn_id],
            reason=StatusReason.CLIENT_CANCELLED,
        )
    if session._response is None or (event.response_id is not None and event.response_id != session._response.id):
        return session._error(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, event.event_id)
    return cancel_response(session, StatusReason.CLIENT_CANCELLED, now)


# ---- creating --------------------------------------------------------------------------------
def spec_for(session: Session, response_id: str, params: ce.ResponseParams | None) -> ResponseSpec:
    """The response's settings: `params` over the session's configuration."""
    p = params or ce.ResponseParams()
    oob = p.conversation is ce.ConversationMode.NONE
    config = session.config
    return ResponseSpec(
        response_id=response_id,
        voice=p.voice or config.voice,
        output_modalities=p.output_modalities or config.output_modalities,
        output_format=p.output_format or config.output_format,
        max_output_tokens=p.max_output_tokens or config.max_output_tokens,
        temperature=p.temperature if p.temperature is not None else config.temperature,
        conversation_id=None if oob else session.conversation_id,
        metadata=p.metadata,
        forces_call=forces_call(*_offered(session, params)),
    )


def turn_request(
    session: Session, turn_id: str, spec: ResponseSpec, history: tuple[Message, ...],
    params: ce.ResponseParams | None,
) -> TurnRequest:
    """The engine turn that generates response `spec` over `history`."""
    instructions = params.instructions if params is not None and params.instructions is not None else None
    if instructions is None:
        instructions = session.config.instructions
    max_tokens = spec.max_output_tokens
    tools, forced_prefix, forced_choices = engine_tools(*_offered(session, params))
    return TurnRequest(
        turn_id=turn_id,
        conversation_id=spec.conversation_id or session._oob_conversation_id,
        history=history,
        system=instructions or None,
        sampling=SamplingParams(
            temperature=spec.temperature,
            max_tokens=session.settings.max_output_tokens if max_tokens == "inf" else max_tokens,
        ),
        voice=_engine_voice(session, spec.voice) if spec.is_audio else None,
        with_audio=spec.is_audio,
        caption=talker_caption(session.config, params) if spec.is_audio else None,
        truncation=_engine_truncation(session.config.truncation),
        tools=tools,
        forced_prefix=forced_prefix,
        forced_choices=forced_choices,
    )


def _offered(session: Session, params: ce.ResponseParams | None):
    """(the tools the model sees: functions and each listed MCP server's tools, the tool choice) of a response."""
    tools, choice = response_tools(session.config, params)
    return session.mcp.expand(tools), choice


def _engine_voice(session: Session, voice: str):
    """The checkpoint voice or the cloned voice that speaks `voice` (OpenAI names: the default voice)."""
    return session._accepted_voices.engine_voice(voice)


def _engine_truncation(value) -> Truncation:
    """The engine's truncation policy for the session's (validated) `truncation` value."""
    if isinstance(value, str):
        return Truncation(value)
    limits = value.get("token_limits") or {}
    return Truncation("retention_ratio", float(value["retention_ratio"]), limits.get("post_instructions"))


def start_response(
    session: Session,
    now: float,
    *,
    params: ce.ResponseParams | None = None,
    history: tuple[Message, ...] | None = None,
    turn_id: str | None = None,
) -> list[Action]:
    """Create the active response; submit its turn unless it is a confirmed speculation."""
    session._idle.disarm()
    spec = spec_for(session, turn_id or new_id(IdPrefix.RESPONSE), params)
    actions: list[Action] = []
    if turn_id is None:
        if spec.conversation_id is None:
            session._oob_used = True
        turn_history = history if history is not None else session.conversation.history()
        request = turn_request(session, spec.response_id, spec, turn_history, params)
        if spec.conversation_id is not None:  # a transcription of its user audio reuses its prefill
            session._transcriber.note_reply(request)
        actions.append(SubmitTurn(request))
    item = AssistantItem(new_id(IdPrefix.ITEM), is_audio=spec.is_audio)
    offered = response_tools(session.config, params)[0]
    playback = None
    if spec.conversation_id is not None and spec.is_audio:  # the listener's side of it (out of band: not followed)
        playback = session._playback.start(spec.response_id, item.id, now, events=session.config.output_audio_buffer)
    response = ActiveResponse(
        spec, item, engine_rate_hz=OUTPUT_SAMPLE_RATE_HZ, frame_ms=session.settings.output_frame_ms,
        conversation=session.conversation if spec.conversation_id is not None else None,
        input_end_at=now, is_speculative=turn_id is not None, playback=playback,
        mcp_target=lambda name: session.mcp.target(offered, name),
    )
    response.params = params
    if spec.conversation_id is None:
        session._oob[spec.response_id] = response
    else:
        session._response = response
    if spec.is_audio:
        session._has_spoken = True
    actions += [Send(e) for e in response.created_events()]
    return actions


# ---- finishing -------------------------------------------------------------------------------
def _response_of(session: Session, turn_id: str) -> ActiveResponse | None:
    """The running response (default conversation or out of band) of engine turn `turn_id`."""
    if session._response is not None and session._response.id == turn_id:
        return session._response
    return session._oob.get(turn_id)


def _forget(session: Session, response: ActiveResponse) -> None:
    if response is session._response:
        session._response = None
        session._gate.drop(response.id)  # output still waiting never goes out
    session._oob.pop(response.id, None)


def finish_response(
    session: Session, status: ResponseStatus, now: float, *, response: ActiveResponse | None = None, **details
) -> list[Action]:
    """End `response` (default: the active one) with `status`: its pending `.done` events, then `response.done`."""
    response = response or session._response
    assert response is not None
    main = response is session._response
    _forget(session, response)
    td = session.config.turn_detection
    if (main and isinstance(td, ServerVad) and td.idle_timeout_ms is not None
            and status is not ResponseStatus.CANCELLED):
        playing_ms = response.item.audio_ms if response.playback is None else response.playback.lead_ms(now)
        session._idle.arm(session._input.position_ms, playing_ms, td.idle_timeout_ms)
    events, record = response.finish(status, now, timing_events=session.config.timing_events, **details)
    trace_response(session.config, response.id, status, details.get("usage"))
    return [Send(e) for e in events] + [record] + session._evict()


def finish_or_wait(session: Session, response: ActiveResponse, status: ResponseStatus, now: float,
                   **details) -> list[Action]:
    """The engine turn of `response` ended: finish it now, or once the MCP calls it started have settled
    (`mcp_flow.on_called` calls again). A completed response that called MCP tools, or during which an
    approved call settled, is followed by the response that answers from their results (`follow_up`)."""
    if response.calls.pending and status is ResponseStatus.COMPLETED:
        response.deferred = (status, details)
        return []
    answers = response.owes_answer or any(getattr(i, "type", "") == "mcp_call" for i in response.calls.items)
    actions = finish_response(session, status, now, response=response, **details)
    if answers and status is ResponseStatus.COMPLETED and response.spec.conversation_id is not None:
        actions += follow_up(session, now, response.params, response.follow_ups)
    return actions


def follow_up(session: Session, now: float, params: object, follow_ups: int) -> list[Action]:
    """The model answers from MCP results: a response in the default conversation with `params` (those of the
    response before it, its forced tool choice relaxed to `auto`, else it would call again), unless one is
    running or `follow_ups` in a row were created already."""
    if session._response is not None or follow_ups >= MAX_FOLLOW_UPS:
        return []
    params = params if isinstance(params, ce.ResponseParams) else ce.ResponseParams()
    params = replace(params, tool_choice=ToolChoiceMode.AUTO, input=None)
    actions = start_response(session, now, params=params)
    if session._response is not None:
        session._response.follow_ups = follow_ups + 1
    return actions


def cancel_response(session: Session, reason: StatusReason, now: float) -> list[Action]:
    """Barge-in or client cancel: stop the engine turn and end the response at once."""
    assert session._response is not None
    turn_id = session._response.id
    return [CancelTurn(turn_id)] + finish_response(session, ResponseStatus.CANCELLED, now, reason=reason)


def abort_response(session: Session, turn_id: str, now: float) -> list[Action]:
    """Handling the output of `turn_id` failed unexpectedly: stop its engine turn and end its
    response `failed` with `server_error` (the next response works). No-op for a turn that
    is not the active response's."""
    response = _response_of(session, turn_id)
    if response is None:
        return []
    error = ErrorDetail(
        type=ErrorType.SERVER.value, code=ErrorCode.SERVER_ERROR.value, message=ErrorCode.SERVER_ERROR.render()
    )
    actions: list[Action] = [CancelTurn(turn_id)]
    try:
        return actions + finish_response(session, ResponseStatus.FAILED, now, response=response, error=error)
    except Exception as exc:  # its events cannot be built either: it ends without them
        _forget(session, response)
        log_failure(log, session.config.id, "response.done", turn_id, exc)
        return actions


def drop_responses_since(session: Session, before: ActiveResponse | None, oob_before: set[str]) -> list[Action]:
    """A handler failed: cancel the responses it created, whose turns may never have been submitted
    (else the session would refuse every later response)."""
    actions: list[Action] = []
    if session._response is not None and session._response is not before:
        actions.append(CancelTurn(session._response.id))
        session._response = None
    for response_id in set(session._oob) - oob_before:
        actions.append(CancelTurn(session._oob.pop(response_id).id))
    return actions


# ---- engine events ---------------------------------------------------------------------------
def on_engine_event(session: Session, event: TurnEvent, now: float) -> list[Action]:
    """Apply one engine event to its response; output of turns that are no longer active is dropped."""
    response = _response_of(session, event.turn_id)
    if response is None:
        return []
    if isinstance(event, TextDelta):
        return [Send(e) for e in response.on_text(event.text)]
    if isinstance(event, AudioChunk):
        return [Send(e) for e in response.on_audio(event.pcm, now, whole=event.backlog)]
    if isinstance(event, StageMark):
        response.on_stage(event.stage, event.t)
        return []
    if isinstance(event, (ToolCallStart, ToolCallArguments, ToolCallEnd)):
        calls = response.calls
        return [Send(e) for e in calls.on_event(event)] + session.mcp.take(calls.started, calls.approvals)
    if isinstance(event, TurnDone):
        usage = usage_of(event)
        for stage, t in event.stages.items():
            response.on_stage(stage, t)
        malformed = response.calls.failure()
        if malformed is not None and not (event.finish_reason is FinishReason.LENGTH
                                          and response.calls.unterminated):
            return finish_response(session, ResponseStatus.FAILED, now, response=response, error=malformed, usage=usage)
        if event.finish_reason is FinishReason.LENGTH:
            return finish_response(
                session, ResponseStatus.INCOMPLETE, now, response=response, reason=StatusReason.MAX_OUTPUT_TOKENS,
                usage=usage,
            )
        return finish_or_wait(session, response, ResponseStatus.COMPLETED, now, usage=usage)
    if isinstance(event, TurnCancelled):
        return finish_response(session, ResponseStatus.CANCELLED, now, response=response)
    assert isinstance(event, TurnFailed)
    return _on_turn_failed(session, response, event, now)


def _on_turn_failed(session: Session, response: ActiveResponse, event: TurnFailed, now: float) -> list[Action]:
    """A failed response names its cause; unless the cause is transient (capacity, shutdown, a dead
    engine), the input items the turn added since the model's last output (the user/system messages and
    function results after the last assistant message or function call) are removed from the conversation,
    each announced with `conversation.item.deleted`, so that the next response does not fail on them again.
    The model's own output (messages, function calls) and everything before it stay."""
    error, transient = failure_error(response.id, event)
    log.warning("response %s failed in the engine (%s): %s", response.id, error.code, event.message)
    actions = finish_response(session, ResponseStatus.FAILED, now, response=response, error=error)
    if transient or response.spec.conversation_id is None:
        return actions
    new_inputs = []
    for entry in session.conversation.newest_first():
        if entry is response.item:
            continue
        if isinstance(entry, AssistantItem) or isinstance(entry.item, FunctionCallItem):
            break
        new_inputs.append(entry.id)
    for item_id in reversed(new_inputs):
        session.conversation.delete(item_id)
        actions += session._transcriber.forget_item(item_id)
        actions.append(Send(ConversationItemDeleted(item_id=item_id)))
    return actions
