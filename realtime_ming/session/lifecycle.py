"""The responses of a session: creating, finishing and cancelling them (`Responses`).

`Responses` owns the default conversation's one active response and the out-of-band responses beside it:
`response.create` / `response.cancel`, the engine request a response submits, the engine events that drive it
to `response.done`, and the cleanup after a failed turn or a failed handler. The session composes it with the
collaborators it reads (the conversation, the MCP servers, the transcriber, the playback clocks, the output gate,
the idle timer); it reaches none of the session's own state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

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
from ..protocol.audio_input import ServerVad
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode, ErrorType
from ..protocol.errors import ProtocolError
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import FunctionCallItem, ItemReference
from ..protocol.responses import ErrorDetail, ResponseStatus, StatusReason
from ..protocol.server_events import ConversationItemDeleted
from ..protocol.session import SessionConfig
from ..protocol.values import ToolChoiceMode
from .actions import Action, CancelTurn, Send, SubmitTurn, error_reply
from .barge_in import OutputGate
from .config import SessionSettings
from .conversation import AssistantItem, Conversation, merge_calls
from .failures import log_failure
from .idle import IdleTimer
from .mcp import check_mcp_tools
from .mcp_calls import McpServers
from .media_intake import MediaIntake
from .playback import Playback
from .prompt_limits import PromptLimits, talker_caption
from .response import ActiveResponse, ResponseSpec, failure_error
from .speculative import Speculation
from .tools import check_tool_choice, engine_tools, forces_call, response_tools
from .tracing import trace_response
from .transcription import Transcriber
from .usage import usage_of
from .voices import SessionVoices

__all__ = ["MAX_FOLLOW_UPS", "Responses"]

# The session's logger: its log lines keep the name they have always had.
log = logging.getLogger(__package__ + ".session")

# Follow-up responses in a row that may call MCP tools again: past it, a response's calls still run but the
# server creates no further response (a model that calls tools forever is stopped).
MAX_FOLLOW_UPS = 8


class Responses:
    """The running responses of one session (not thread-safe). `config` gives the session's current
    configuration (a `session.update` replaces it); `input_ms` the position of its input audio."""

    def __init__(
        self, *, settings: SessionSettings, config: Callable[[], SessionConfig], dialect: Dialect,
        conversation: Conversation, conversation_id: str, voices: SessionVoices, prompt_limits: PromptLimits,
        mcp: McpServers, mcp_allowed_hosts: frozenset[str], intake: MediaIntake, transcriber: Transcriber,
        speculation: Speculation, playback: Playback, gate: OutputGate, idle: IdleTimer,
        input_ms: Callable[[], int],
    ) -> None:
        self.settings, self._config, self._dialect = settings, config, dialect
        self._conversation, self.conversation_id = conversation, conversation_id
        self._voices, self._prompt_limits = voices, prompt_limits
        self._mcp, self._mcp_allowed_hosts, self._intake = mcp, mcp_allowed_hosts, intake
        self._transcriber, self._speculation = transcriber, speculation
        self._playback, self._gate, self._idle, self._input_ms = playback, gate, idle, input_ms
        self._active: ActiveResponse | None = None  # the one response of the default conversation
        self._oob: dict[str, ActiveResponse] = {}  # out-of-band responses running beside it, by id
        self.oob_used = False  # an out-of-band response ran: its conversation slot is closed with the session
        self.has_spoken = False  # the voice is fixed after the first audio response

    # ---- what runs -------------------------------------------------------------------------------
    @property
    def active(self) -> ActiveResponse | None:
        """The default conversation's response being generated, if any."""
        return self._active

    @property
    def responding(self) -> bool:
        """Any response runs (default conversation or out of band)."""
        return self._active is not None or bool(self._oob)

    def running(self) -> list[ActiveResponse]:
        """Every running response: the active one first, then the out-of-band ones."""
        return ([] if self._active is None else [self._active]) + list(self._oob.values())

    def snapshot(self) -> tuple[ActiveResponse | None, frozenset[str]]:
        """What runs now, for `drop_since` after a failed handler."""
        return self._active, frozenset(self._oob)

    @property
    def oob_conversation_id(self) -> str:
        # Out-of-band responses get their own KV slot so they do not evict the main prefix.
        return self.conversation_id + "_oob"

    def of(self, turn_id: str) -> ActiveResponse | None:
        """The running response (default conversation or out of band) of engine turn `turn_id`."""
        if self._active is not None and self._active.id == turn_id:
            return self._active
        return self._oob.get(turn_id)

    def evict(self, *keep: str | None) -> list[Action]:
        """Apply the conversation's bounds (items, bytes): the oldest items go, each announced."""
        active = None if self._active is None else self._active.item.id
        return [Send(ConversationItemDeleted(item_id=i)) for i in self._conversation.evict((*keep, active))]

    def close(self) -> list[Action]:
        """The session ends: stop every running turn (no events: nobody listens)."""
        actions: list[Action] = [CancelTurn(r.id) for r in self.running()]
        self._active = None
        self._oob.clear()
        return actions

    # ---- client events ---------------------------------------------------------------------------
    def on_create(self, event: ce.ResponseCreate, now: float) -> list[Action]:
        self._intake.admit(event, now)  # first, as `predecode` charges before it decodes
        params = event.response
        oob = params.conversation is ce.ConversationMode.NONE
        if oob and len(self._oob) >= self.settings.max_out_of_band_responses:
            return error_reply(ErrorCode.TOO_MANY_OUT_OF_BAND_RESPONSES, event.event_id, param="response.conversation",
                               active=len(self._oob), limit=self.settings.max_out_of_band_responses)
        if not oob and self._active is not None:
            return error_reply(
                ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE, event.event_id, response_id=self._active.id
            )
        self._voices.check(params.voice or self._config().voice, "response.voice", event.event_id)
        check_tool_choice(*response_tools(self._config(), params), "response.tool_choice")
        self._prompt_limits.check_response(self._config(), params, self._dialect)
        if params.tools is not None:
            check_mcp_tools(params.tools, self._mcp_allowed_hosts, "response.tools")
        # a server named here first is listed now; this response offers only tools already listed
        listing = [] if params.tools is None else self._mcp.list_new(params.tools)
        history = None if params.input is None else self._history_from(params.input)
        # An out-of-band response leaves the conversation as it is: a speculative turn stays valid.
        actions = [] if oob else self._speculation.discard()
        return listing + actions + self.start(now, params=params, history=history)

    def _history_from(self, items) -> tuple[Message, ...]:
        """Engine messages for `response.create` `input` (references and inline items)."""
        messages = []
        for i, item in enumerate(items):
            if isinstance(item, ItemReference):
                entry = self._conversation.get(item.id)
                if entry is None:
                    raise ProtocolError(
                        ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, param=f"response.input[{i}].id", item_id=item.id
                    )
            else:
                entry = self._intake.store(item, f"response.input[{i}]", self._config().input_format, self._mcp)
            messages.append(entry.message())
        return merge_calls(messages)

    def on_cancel(self, event: ce.ResponseCancel, now: float) -> list[Action]:
        if event.response_id in self._oob:
            turn_id = event.response_id
            return [CancelTurn(turn_id)] + self.finish(
                ResponseStatus.CANCELLED, now, response=self._oob[turn_id],
                reason=StatusReason.CLIENT_CANCELLED,
            )
        if self._active is None or (event.response_id is not None and event.response_id != self._active.id):
            return error_reply(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, event.event_id)
        return self.cancel(StatusReason.CLIENT_CANCELLED, now)

    # ---- creating --------------------------------------------------------------------------------
    def spec_for(self, response_id: str, params: ce.ResponseParams | None) -> ResponseSpec:
        """The response's settings: `params` over the session's configuration."""
        p = params or ce.ResponseParams()
        oob = p.conversation is ce.ConversationMode.NONE
        config = self._config()
        return ResponseSpec(
            response_id=response_id,
            voice=p.voice or config.voice,
            output_modalities=p.output_modalities or config.output_modalities,
            output_format=p.output_format or config.output_format,
            max_output_tokens=p.max_output_tokens or config.max_output_tokens,
            temperature=p.temperature if p.temperature is not None else config.temperature,
            conversation_id=None if oob else self.conversation_id,
            metadata=p.metadata,
            forces_call=forces_call(*self._offered(params)),
        )

    def turn_request(self, turn_id: str, spec: ResponseSpec, history: tuple[Message, ...],
                     params: ce.ResponseParams | None) -> TurnRequest:
        """The engine turn that generates response `spec` over `history`."""
        instructions = params.instructions if params is not None and params.instructions is not None else None
        if instructions is None:
            instructions = self._config().instructions
        max_tokens = spec.max_output_tokens
        tools, forced_prefix, forced_choices = engine_tools(*self._offered(params))
        return TurnRequest(
            turn_id=turn_id,
            conversation_id=spec.conversation_id or self.oob_conversation_id,
            history=history,
            system=instructions or None,
            sampling=SamplingParams(
                temperature=spec.temperature,
                max_tokens=self.settings.max_output_tokens if max_tokens == "inf" else max_tokens,
            ),
            voice=self._engine_voice(spec.voice) if spec.is_audio else None,
            with_audio=spec.is_audio,
            caption=talker_caption(self._config(), params) if spec.is_audio else None,
            truncation=_engine_truncation(self._config().truncation),
            tools=tools,
            forced_prefix=forced_prefix,
            forced_choices=forced_choices,
        )

    def _offered(self, params: ce.ResponseParams | None):
        """(the tools the model sees: functions and each listed MCP server's tools, the tool choice) of a response."""
        tools, choice = response_tools(self._config(), params)
        return self._mcp.expand(tools), choice

    def _engine_voice(self, voice: str):
        """The checkpoint voice or the cloned voice that speaks `voice` (OpenAI names: the default voice)."""
        return self._voices.engine_voice(voice)


    def start(self, now: float, *, params: ce.ResponseParams | None = None,
              history: tuple[Message, ...] | None = None, turn_id: str | None = None) -> list[Action]:
        """Create the active response; submit its turn unless it is a confirmed speculation."""
        self._idle.disarm()
        spec = self.spec_for(turn_id or new_id(IdPrefix.RESPONSE), params)
        actions: list[Action] = []
        if turn_id is None:
            if spec.conversation_id is None:
                self.oob_used = True
            turn_history = history if history is not None else self._conversation.history()
            request = self.turn_request(spec.response_id, spec, turn_history, params)
            if spec.conversation_id is not None:  # a transcription of its user audio reuses its prefill
                self._transcriber.note_reply(request)
            actions.append(SubmitTurn(request))
        item = AssistantItem(new_id(IdPrefix.ITEM), is_audio=spec.is_audio)
        offered = response_tools(self._config(), params)[0]
        playback = None
        if spec.conversation_id is not None and spec.is_audio:  # the listener's side of it (out of band: not followed)
            playback = self._playback.start(spec.response_id, item.id, now, events=self._config().output_audio_buffer)
        response = ActiveResponse(
            spec, item, engine_rate_hz=OUTPUT_SAMPLE_RATE_HZ, frame_ms=self.settings.output_frame_ms,
            conversation=self._conversation if spec.conversation_id is not None else None,
            input_end_at=now, is_speculative=turn_id is not None, playback=playback,
            mcp_target=lambda name: self._mcp.target(offered, name),
        )
        response.params = params
        if spec.conversation_id is None:
            self._oob[spec.response_id] = response
        else:
            self._active = response
        if spec.is_audio:
            self.has_spoken = True
        actions += [Send(e) for e in response.created_events()]
        return actions

    # ---- finishing -------------------------------------------------------------------------------
    def _forget(self, response: ActiveResponse) -> None:
        if response is self._active:
            self._active = None
            self._gate.drop(response.id)  # output still waiting never goes out
        self._oob.pop(response.id, None)

    def finish(self, status: ResponseStatus, now: float, *, response: ActiveResponse | None = None,
               **details) -> list[Action]:
        """End `response` (default: the active one) with `status`: its pending `.done` events, then `response.done`."""
        response = response or self._active
        assert response is not None
        main = response is self._active
        self._forget(response)
        td = self._config().turn_detection
        if (main and isinstance(td, ServerVad) and td.idle_timeout_ms is not None
                and status is not ResponseStatus.CANCELLED):
            playing_ms = response.item.audio_ms if response.playback is None else response.playback.lead_ms(now)
            self._idle.arm(self._input_ms(), playing_ms, td.idle_timeout_ms)
        events, record = response.finish(status, now, timing_events=self._config().timing_events, **details)
        trace_response(self._config(), response.id, status, details.get("usage"))
        return [Send(e) for e in events] + [record] + self.evict()

    def finish_or_wait(self, response: ActiveResponse, status: ResponseStatus, now: float,
                       **details) -> list[Action]:
        """The engine turn of `response` ended: finish it now, or once the MCP calls it started have settled
        (`mcp_flow.McpFlow.on_called` calls again). A completed response that called MCP tools, or during which an
        approved call settled, is followed by the response that answers from their results (`follow_up`)."""
        if response.calls.pending and status is ResponseStatus.COMPLETED:
            response.deferred = (status, details)
            return []
        answers = response.owes_answer or any(getattr(i, "type", "") == "mcp_call" for i in response.calls.items)
        actions = self.finish(status, now, response=response, **details)
        if answers and status is ResponseStatus.COMPLETED and response.spec.conversation_id is not None:
            actions += self.follow_up(now, response.params, response.follow_ups)
        return actions

    def follow_up(self, now: float, params: object, follow_ups: int) -> list[Action]:
        """The model answers from MCP results: a response in the default conversation with `params` (those of the
        response before it, its forced tool choice relaxed to `auto`, else it would call again), unless one is
        running or `follow_ups` in a row were created already."""
        if self._active is not None or follow_ups >= MAX_FOLLOW_UPS:
            return []
        params = params if isinstance(params, ce.ResponseParams) else ce.ResponseParams()
        params = replace(params, tool_choice=ToolChoiceMode.AUTO, input=None)
        actions = self.start(now, params=params)
        if self._active is not None:
            self._active.follow_ups = follow_ups + 1
        return actions

    def cancel(self, reason: StatusReason, now: float) -> list[Action]:
        """Barge-in or client cancel: stop the engine turn and end the response at once."""
        assert self._active is not None
        turn_id = self._active.id
        return [CancelTurn(turn_id)] + self.finish(ResponseStatus.CANCELLED, now, reason=reason)

    def abort(self, turn_id: str, now: float) -> list[Action]:
        """Handling the output of `turn_id` failed unexpectedly: stop its engine turn and end its
        response `failed` with `server_error` (the next response works). No-op for a turn that
        is not the active response's."""
        response = self.of(turn_id)
        if response is None:
            return []
        error = ErrorDetail(
            type=ErrorType.SERVER.value, code=ErrorCode.SERVER_ERROR.value, message=ErrorCode.SERVER_ERROR.render()
        )
        actions: list[Action] = [CancelTurn(turn_id)]
        try:
            return actions + self.finish(ResponseStatus.FAILED, now, response=response, error=error)
        except Exception as exc:  # its events cannot be built either: it ends without them
            self._forget(response)
            log_failure(log, self._config().id, "response.done", turn_id, exc)
            return actions

    def drop_since(self, before: ActiveResponse | None, oob_before: frozenset[str]) -> list[Action]:
        """A handler failed: cancel the responses it created, whose turns may never have been submitted
        (else the session would refuse every later response)."""
        actions: list[Action] = []
        if self._active is not None and self._active is not before:
            actions.append(CancelTurn(self._active.id))
            self._active = None
        for response_id in set(self._oob) - oob_before:
            actions.append(CancelTurn(self._oob.pop(response_id).id))
        return actions

    # ---- engine events ---------------------------------------------------------------------------
    def on_engine_event(self, event: TurnEvent, now: float) -> list[Action]:
        """Apply one engine event to its response; output of turns that are no longer active is dropped."""
        response = self.of(event.turn_id)
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
            return [Send(e) for e in calls.on_event(event)] + self._mcp.take(calls.started, calls.approvals)
        if isinstance(event, TurnDone):
            usage = usage_of(event)
            for stage, t in event.stages.items():
                response.on_stage(stage, t)
            malformed = response.calls.failure()
            if malformed is not None and not (event.finish_reason is FinishReason.LENGTH
                                              and response.calls.unterminated):
                return self.finish(ResponseStatus.FAILED, now, response=response, error=malformed, usage=usage)
            if event.finish_reason is FinishReason.LENGTH:
                return self.finish(
                    ResponseStatus.INCOMPLETE, now, response=response, reason=StatusReason.MAX_OUTPUT_TOKENS,
                    usage=usage,
                )
            return self.finish_or_wait(response, ResponseStatus.COMPLETED, now, usage=usage)
        if isinstance(event, TurnCancelled):
            return self.finish(ResponseStatus.CANCELLED, now, response=response)
        assert isinstance(event, TurnFailed)
        return self._on_turn_failed(response, event, now)

    def _on_turn_failed(self, response: ActiveResponse, event: TurnFailed, now: float) -> list[Action]:
        """A failed response names its cause; unless the cause is transient (capacity, shutdown, a dead
        engine), the input items the turn added since the model's last output (the user/system messages and
        function results after the last assistant message or function call) are removed from the conversation,
        each announced with `conversation.item.deleted`, so that the next response does not fail on them again.
        The model's own output (messages, function calls) and everything before it stay."""
        error, transient = failure_error(response.id, event)
        log.warning("response %s failed in the engine (%s): %s", response.id, error.code, event.message)
        actions = self.finish(ResponseStatus.FAILED, now, response=response, error=error)
        if transient or response.spec.conversation_id is None:
            return actions
        new_inputs = []
        for entry in self._conversation.newest_first():
            if entry is response.item:
                continue
            if isinstance(entry, AssistantItem) or isinstance(entry.item, FunctionCallItem):
                break
            new_inputs.append(entry.id)
        for item_id in reversed(new_inputs):
            self._conversation.delete(item_id)
            actions += self._transcriber.forget_item(item_id)
            actions.append(Send(ConversationItemDeleted(item_id=item_id)))
        return actions


def _engine_truncation(value) -> Truncation:
    """The engine's truncation policy for the session's (validated) `truncation` value."""
    if isinstance(value, str):
        return Truncation(value)
    limits = value.get("token_limits") or {}
    return Truncation("retention_ratio", float(value["retention_ratio"]), limits.get("post_instructions"))
