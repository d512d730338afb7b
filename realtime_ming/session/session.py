"""The per-connection Realtime state machine (Sans-I/O).

`Session` takes parsed client events (or the `ProtocolError` a frame became), engine
`TurnEvent`s and the current monotonic time, and returns `Action`s: server events to send and
engine commands. It owns the input buffer, server_vad turns (speculative turns started at a
pause, confirmed at speech stop, discarded on resume), the conversation, the one active response,
barge-in and truncation. Nothing here touches a socket, a thread or a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..audio.denoise import DenoiserUnavailable
from ..audio.pcm import AudioFormatError
from ..audio.turns import SpeechPaused, SpeechResumed
from ..audio.vad import VadBackend
from ..engine.api import (
    OUTPUT_SAMPLE_RATE_HZ,
    AudioChunk,
    Content,
    FinishReason,
    Message,
    SamplingParams,
    StageMark,
    TextDelta,
    Truncation,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnRequest,
)
from ..protocol import client_events as ce
from ..protocol.dialect import Dialect
from ..protocol.errors import ErrorCode, ErrorType, ProtocolError
from ..protocol.events import ClientEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import ContentPart, InputAudio, ItemReference, ItemStatus, MessageItem, Role
from ..protocol.responses import ErrorDetail, ResponseStatus, StatusReason
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    Error,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioBufferTimeoutTriggered,
    SessionCreated,
    SessionUpdated,
)
from ..protocol.session import (
    SemanticVad,
    ServerVad,
    SessionConfig,
    apply_patch,
)
from .actions import (
    Action,
    CancelTurn,
    CloseConversation,
    ConfirmTurn,
    DiscardTurn,
    Send,
    SubmitTurn,
)
from .audio_io import MODEL_SAMPLE_RATE_HZ
from .config import SessionSettings
from .content import MediaLimits, media_parts, part_to_content, strip_audio
from .conversation import AssistantItem, Conversation, StoredItem, merge_calls
from .tools import check_tool_choice, engine_tools, response_tools
from .failures import log_failure
from .idle import IdleTimer
from .input import BufferFull, InputTurns, SpeechBegan, SpeechEnded, TurnSignal
from .response import ActiveResponse, ResponseSpec, failure_error
from .tracing import check_tracing_update, trace_response
from .usage import usage_of
from .transcription import Transcriber, check_transcription

__all__ = ["OPENAI_VOICE_ALIASES", "Session"]

log = logging.getLogger(__name__)

# OpenAI's built-in voice names (docs/protocol.md §3.1). Clients send them by default
# (openai-agents: "ash"), so they are accepted and spoken with the session's default voice.
OPENAI_VOICE_ALIASES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")


@dataclass(slots=True)
class _Speculation:
    """A speculative turn submitted at a pause: its id and the exact user audio it heard."""

    turn_id: str
    audio: np.ndarray  # [n] float32 16 kHz


class Session:
    """One Realtime session. Call `start()` once, then the `handle_*` methods; each returns the
    actions to perform, in order. Not thread-safe: drive it from one event loop."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        dialect: Dialect,
        model: str,
        voices: Sequence[str],
        default_voice: str,
        make_vad: Callable[[str], VadBackend],
        media: MediaLimits | None = None,
    ) -> None:
        self.settings = settings
        self.media = media or MediaLimits(min_audio_ms=settings.min_commit_ms, max_audio_s=settings.max_input_audio_s)
        self.dialect = dialect
        self.voices = tuple(voices)
        self._default_voice = default_voice
        self._accepted_voices = self.voices + tuple(v for v in OPENAI_VOICE_ALIASES if v not in self.voices)
        vad = settings.vad
        turn_detection = (
            ServerVad(
                threshold=vad.detector.threshold,
                prefix_padding_ms=vad.detector.prefix_padding_ms,
                silence_duration_ms=vad.detector.silence_duration_ms,
                create_response=vad.create_response,
                interrupt_response=vad.interrupt_response,
            )
            if vad.enabled
            else None
        )
        self.config = SessionConfig(
            model=model,
            instructions=settings.instructions,
            voice=default_voice,
            turn_detection=turn_detection,
            temperature=settings.temperature,
        )
        self.conversation_id = new_id(IdPrefix.CONVERSATION)
        self.conversation = Conversation(settings.max_items, self.media.max_conversation_bytes)
        self._predecoded: dict[int, Content | ProtocolError] = {}  # id(part) -> its model view (predecode)
        self._input = InputTurns(vad, make_vad, settings.max_input_audio_s)
        self._input.configure(self.config.input_format, self.config.turn_detection)
        self._speculation: _Speculation | None = None
        self._response: ActiveResponse | None = None  # the one response of the default conversation
        self._oob: dict[str, ActiveResponse] = {}  # out-of-band responses running beside it, by id
        self._idle = IdleTimer()  # GA turn_detection.idle_timeout_ms
        self._has_spoken = False  # the voice is fixed after the first audio response
        self._oob_used = False
        self._transcriber = Transcriber(self.conversation, self.conversation_id)
        self._served_model = model

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> list[Action]:
        """The first server event: `session.created` with the default session."""
        return [Send(SessionCreated(session=self.config))]

    def close(self) -> list[Action]:
        """The connection is gone: stop and free everything this session holds in the engine."""
        actions: list[Action] = self._discard_speculation()
        for response in [self._response, *self._oob.values()]:
            if response is not None:
                actions.append(CancelTurn(response.id))
        self._response = None
        self._oob.clear()
        actions += self._transcriber.close()
        actions.append(CloseConversation(self.conversation_id))
        if self._oob_used:
            actions.append(CloseConversation(self._oob_conversation_id))
        return actions

    @property
    def active_response_id(self) -> str | None:
        """Id of the response being generated, if any."""
        return None if self._response is None else self._response.id

    @property
    def _oob_conversation_id(self) -> str:
        # Out-of-band responses get their own KV slot so they do not evict the main prefix.
        return self.conversation_id + "_oob"

    # ---- client events -----------------------------------------------------------------------
    def handle_client_event(self, event: ClientEvent | ProtocolError, now: float) -> list[Action]:
        """Apply one parsed client event (or report the error its frame became)."""
        if isinstance(event, ProtocolError):
            return [Send(Error.from_protocol_error(event))]
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return self._error(ErrorCode.UNSUPPORTED_EVENT, event.event_id, event_type=event.type)
        before, oob_before = self._response, set(self._oob)
        try:
            return handler(self, event, now) + self._release_transcriptions()
        except ProtocolError as error:
            return [Send(Error.from_protocol_error(error.with_event_id(event.event_id)))]
        except Exception as exc:  # a bug must cost this request, never the session
            log_failure(log, self.config.id, event.type, event.event_id, exc)
            actions: list[Action] = []
            if self._response is not None and self._response is not before:
                # The failed handler created a response whose turn may never have been
                # submitted: drop it, or the session would refuse every later response.
                actions.append(CancelTurn(self._response.id))
                self._response = None
            for response_id in set(self._oob) - oob_before:
                actions.append(CancelTurn(self._oob.pop(response_id).id))
            return actions + self._error(ErrorCode.SERVER_ERROR, event.event_id)

        finally:
            self._predecoded.clear()

    def predecode(self, event: ClientEvent | ProtocolError) -> None:
        """Decode the media of `event` ahead of `handle_client_event` (its next call consumes them).

        Safe to run on a worker thread while the session is otherwise idle: it reads the input
        format and the limits only. Lets the event loop stay responsive while images decode.
        """
        for param, part in media_parts(event):
            try:
                self._predecoded[id(part)] = part_to_content(part, self.config.input_format, param, self.media)
            except Exception as error:  # raised again by the handler on the session's own path
                self._predecoded[id(part)] = error

    def _content(self, part: ContentPart, param: str) -> Content:
        done = self._predecoded.pop(id(part), None)
        if isinstance(done, Exception):
            raise done
        return done if done is not None else part_to_content(part, self.config.input_format, param, self.media)

    def abort_response(self, turn_id: str, now: float) -> list[Action]:
        """Handling the output of `turn_id` failed unexpectedly: stop its engine turn and end its
        response `failed` with `server_error` (the next response works). No-op for a turn that
        is not the active response's."""
        response = self._response_of(turn_id)
        if response is None:
            return []
        error = ErrorDetail(
            type=ErrorType.SERVER.value, code=ErrorCode.SERVER_ERROR.value, message=ErrorCode.SERVER_ERROR.render()
        )
        actions: list[Action] = [CancelTurn(turn_id)]
        try:
            return actions + self._finish_response(ResponseStatus.FAILED, now, response=response, error=error)
        except Exception as exc:  # its events cannot be built either: it ends without them
            self._forget(response)
            log_failure(log, self.config.id, "response.done", turn_id, exc)
            return actions

    def _error(self, code: ErrorCode, event_id: str | None, *, param: str | None = None, **values: object) -> list[Action]:
        return [Send(Error.from_protocol_error(ProtocolError(code, param=param, event_id=event_id, **values)))]

    def _on_session_update(self, event: ce.SessionUpdate, now: float) -> list[Action]:
        new = apply_patch(self.config, event.session, voices=self._accepted_voices)
        if "transcription" in event.session.changes:
            new = replace(new, transcription=check_transcription(
                new.transcription, self._served_model, event.session.param("transcription")))
        check_tool_choice(new.tools, new.tool_choice, event.session.param("tool_choice"))
        if new.voice != self.config.voice and self._has_spoken:
            return self._error(ErrorCode.CANNOT_UPDATE_VOICE, event.event_id, param=event.session.param("voice"))
        if "tracing" in event.session.changes:
            check_tracing_update(self.config, new, event.session.param("tracing"))
        if new.noise_reduction != self.config.noise_reduction:
            try:
                self._input.set_noise_reduction(new.noise_reduction is not None)
            except DenoiserUnavailable as exc:  # refuse rather than echo a setting that would not act
                assert new.noise_reduction is not None
                return self._error(ErrorCode.UNSUPPORTED_NOISE_REDUCTION, event.event_id,
                                   param=event.session.param("noise_reduction"),
                                   kind=new.noise_reduction.type.value, detail=str(exc))
        old, self.config = self.config, new
        actions = self._discard_speculation()
        if (new.input_format, new.turn_detection) != (old.input_format, old.turn_detection):
            self._input.configure(new.input_format, new.turn_detection)
        actions.append(Send(SessionUpdated(session=new)))
        return actions

    def _on_append(self, event: ce.InputAudioBufferAppend, now: float) -> list[Action]:
        td = self.config.turn_detection
        self._input.guard_barge_in(self._response is not None and td is not None and td.interrupt_response)
        try:
            signals = self._input.append(event.audio)
        except AudioFormatError as exc:
            return self._error(ErrorCode.INVALID_AUDIO, event.event_id, param="audio", detail=str(exc))
        except BufferFull:
            return self._error(
                ErrorCode.INPUT_AUDIO_BUFFER_TOO_LARGE, event.event_id, param="audio",
                max_s=self.settings.max_input_audio_s,
            )
        actions: list[Action] = []
        for signal in signals:
            actions += self._on_turn_signal(signal, now)
        return actions + self._check_idle(now)

    def _check_idle(self, now: float) -> list[Action]:
        """idle_timeout_ms passed since the last reply played out: commit the idle input, prompt the user."""
        span = self._idle.expired(self._input.position_ms)
        if span is None or self._response is not None or self._input.in_speech:
            return []
        item_id, audio = self._input.commit()
        actions: list[Action] = [Send(InputAudioBufferTimeoutTriggered(
            audio_start_ms=span[0], audio_end_ms=span[1], item_id=item_id))]
        return actions + self._discard_speculation() + self._commit_audio(item_id, audio) + self._start_response(now)

    def _on_commit(self, event: ce.InputAudioBufferCommit, now: float) -> list[Action]:
        # The resampler holds back its filter delay (up to 85 ms for 8 kHz G.711): the commit
        # ends the stream, so that tail belongs to this turn.
        self._input.flush()
        buffered_ms = self._input.buffered_ms
        if buffered_ms < self.settings.min_commit_ms:
            return self._error(
                ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY, event.event_id,
                min_ms=self.settings.min_commit_ms, buffered_ms=buffered_ms,
            )
        item_id, audio = self._input.commit()
        return self._discard_speculation() + self._commit_audio(item_id, audio)

    def _on_clear(self, event: ce.InputAudioBufferClear, now: float) -> list[Action]:
        self._input.clear(reset_decoder=True)
        return self._discard_speculation() + [Send(InputAudioBufferCleared())]

    def _on_item_create(self, event: ce.ConversationItemCreate, now: float) -> list[Action]:
        item = event.item
        if item.id is not None and item.id in self.conversation:
            return self._error(ErrorCode.DUPLICATE_ITEM_ID, event.event_id, param="item.id", item_id=item.id)
        previous = event.previous_item_id
        if previous is not None and previous != "root" and previous not in self.conversation:
            return self._error(
                ErrorCode.ITEM_CREATE_INVALID_PREVIOUS_ITEM_ID, event.event_id, param="previous_item_id",
                item_id=previous,
            )
        stored = self._store_item(item, "item")
        if stored.nbytes > self.media.max_conversation_bytes:
            return self._error(ErrorCode.ITEM_TOO_LARGE, event.event_id, param="item", num_bytes=stored.nbytes,
                               max_bytes=self.media.max_conversation_bytes)
        actions = self._discard_speculation()
        previous_id = self.conversation.insert(stored, previous)
        view = stored.view()
        return actions + [
            Send(ConversationItemAdded(item=view, previous_item_id=previous_id)),
            Send(ConversationItemDone(item=view, previous_item_id=previous_id)),
        ] + self._evict(stored.id)

    def _evict(self, *keep: str | None) -> list[Action]:
        """Apply the conversation's bounds (items, bytes): the oldest items go, each announced."""
        active = None if self._response is None else self._response.item.id
        return [Send(ConversationItemDeleted(item_id=i)) for i in self.conversation.evict((*keep, active))]

    def _store_item(self, item, param: str) -> StoredItem:
        """Assign id/status and decode the model view of a client item; raises ProtocolError."""
        item = replace(item, id=item.id or new_id(IdPrefix.ITEM), status=ItemStatus.COMPLETED)
        if not isinstance(item, MessageItem):
            return StoredItem(item)
        contents = tuple(self._content(part, f"{param}.content[{i}]") for i, part in enumerate(item.content))
        return StoredItem(replace(item, content=tuple(strip_audio(p) for p in item.content)), contents)

    def _on_item_retrieve(self, event: ce.ConversationItemRetrieve, now: float) -> list[Action]:
        entry = self.conversation.get(event.item_id)
        if entry is None:
            return self._error(
                ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        if isinstance(entry, AssistantItem):
            view = entry.view(with_audio=True)
        else:
            view = entry.view(input_format=self.config.input_format)
        return [Send(ConversationItemRetrieved(item=view))]

    def _on_item_delete(self, event: ce.ConversationItemDelete, now: float) -> list[Action]:
        if not self.conversation.delete(event.item_id):
            return self._error(
                ErrorCode.ITEM_DELETE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        actions = self._discard_speculation() + self._transcriber.forget_item(event.item_id)
        return actions + [Send(ConversationItemDeleted(item_id=event.item_id))]

    def _on_item_truncate(self, event: ce.ConversationItemTruncate, now: float) -> list[Action]:
        entry = self.conversation.get(event.item_id)
        if entry is None:
            return self._error(
                ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        if not isinstance(entry, AssistantItem) or not entry.is_audio or event.content_index != 0:
            return self._error(
                ErrorCode.TRUNCATE_CONTENT_INDEX_INVALID, event.event_id, param="content_index",
                item_id=event.item_id, content_index=event.content_index,
            )
        actions: list[Action] = []
        if self._response is not None and self._response.item is entry:
            # The client stopped playing this item: the rest of its response is unwanted.
            actions += self._cancel_response(StatusReason.CLIENT_CANCELLED, now)
        duration_ms = entry.audio_ms
        if event.audio_end_ms > duration_ms + 1.0:  # 1 ms: clients round the played time up
            return actions + self._error(
                ErrorCode.TRUNCATE_AUDIO_END_MS_INVALID, event.event_id, param="audio_end_ms",
                audio_end_ms=event.audio_end_ms, duration_ms=int(duration_ms), item_id=event.item_id,
            )
        entry.truncate(min(event.audio_end_ms, int(duration_ms)))
        actions += self._discard_speculation()
        return actions + [
            Send(ConversationItemTruncated(
                item_id=event.item_id, content_index=event.content_index, audio_end_ms=event.audio_end_ms
            ))
        ]

    def _on_response_create(self, event: ce.ResponseCreate, now: float) -> list[Action]:
        params = event.response
        oob = params.conversation is ce.ConversationMode.NONE
        if oob and len(self._oob) >= self.settings.max_out_of_band_responses:
            return self._error(ErrorCode.TOO_MANY_OUT_OF_BAND_RESPONSES, event.event_id, param="response.conversation",
                               active=len(self._oob), limit=self.settings.max_out_of_band_responses)
        if not oob and self._response is not None:
            return self._error(
                ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE, event.event_id, response_id=self._response.id
            )
        voice = params.voice or self.config.voice
        if voice not in self._accepted_voices:
            return self._error(
                ErrorCode.UNKNOWN_VOICE, event.event_id, param="response.voice", voice=voice,
                voices=", ".join(sorted(self._accepted_voices)),
            )
        check_tool_choice(*response_tools(self.config, params), "response.tool_choice")
        history = None if params.input is None else self._history_from(params.input)
        # An out-of-band response leaves the conversation as it is: a speculative turn stays valid.
        actions = [] if oob else self._discard_speculation()
        return actions + self._start_response(now, params=params, history=history)

    def _history_from(self, items) -> tuple[Message, ...]:
        """Engine messages for `response.create` `input` (references and inline items)."""
        messages = []
        for i, item in enumerate(items):
            if isinstance(item, ItemReference):
                entry = self.conversation.get(item.id)
                if entry is None:
                    raise ProtocolError(
                        ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, param=f"response.input[{i}].id", item_id=item.id
                    )
            else:
                entry = self._store_item(item, f"response.input[{i}]")
            messages.append(entry.message())
        return merge_calls(messages)

    def _on_response_cancel(self, event: ce.ResponseCancel, now: float) -> list[Action]:
        if event.response_id in self._oob:
            turn_id = event.response_id
            return [CancelTurn(turn_id)] + self._finish_response(
                ResponseStatus.CANCELLED, now, response=self._oob[turn_id], reason=StatusReason.CLIENT_CANCELLED
            )
        if self._response is None or (event.response_id is not None and event.response_id != self._response.id):
            return self._error(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, event.event_id)
        return self._cancel_response(StatusReason.CLIENT_CANCELLED, now)

    def _on_output_audio_clear(self, event: ce.OutputAudioBufferClear, now: float) -> list[Action]:
        # WebSocket sessions have no server-side playout buffer; there is nothing to clear and
        # `output_audio_buffer.cleared` must not reach a WebSocket client (docs/protocol.md §5.1).
        return []

    # ---- turns -------------------------------------------------------------------------------
    def _on_turn_signal(self, signal: TurnSignal, now: float) -> list[Action]:
        td = self.config.turn_detection
        assert isinstance(td, ServerVad | SemanticVad)
        if isinstance(signal, SpeechBegan):
            self._idle.disarm()
            actions: list[Action] = [Send(InputAudioBufferSpeechStarted(
                audio_start_ms=signal.audio_start_ms, item_id=signal.item_id
            ))]
            if self._response is not None and td.interrupt_response:
                actions += self._cancel_response(StatusReason.TURN_DETECTED, now)
            return actions
        if isinstance(signal, SpeechPaused):
            if td.create_response and self._response is None and self._speculation is None:
                return self._speculate(now)
            return []
        if isinstance(signal, SpeechResumed):
            return self._discard_speculation()
        assert isinstance(signal, SpeechEnded)
        return self._on_speech_ended(signal, td, now)

    def _speculate(self, now: float) -> list[Action]:
        """Submit the turn as heard so far; its output is held until speech stop confirms it."""
        audio = self._input.speech_so_far()
        turn_id = new_id(IdPrefix.RESPONSE)
        self._speculation = _Speculation(turn_id, audio)
        user = Message(Role.USER.value, (Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ),))
        request = self._turn_request(turn_id, self._spec(turn_id, None), self.conversation.history() + (user,), None)
        return [SubmitTurn(replace(request, speculative=True))]

    def _discard_speculation(self) -> list[Action]:
        if self._speculation is None:
            return []
        turn_id, self._speculation = self._speculation.turn_id, None
        return [DiscardTurn(turn_id)]

    def _on_speech_ended(self, signal: SpeechEnded, td: ServerVad | SemanticVad, now: float) -> list[Action]:
        actions: list[Action] = [
            Send(InputAudioBufferSpeechStopped(audio_end_ms=signal.audio_end_ms, item_id=signal.item_id))
        ]
        speculation, self._speculation = self._speculation, None
        # The user item holds exactly the audio a speculative turn heard, so the engine's cached
        # prefix matches the history of the next turn.
        audio = speculation.audio if speculation is not None else signal.audio
        actions += self._commit_audio(signal.item_id, audio)
        if not td.create_response or self._response is not None:
            if speculation is not None:
                actions.append(DiscardTurn(speculation.turn_id))
            return actions
        if speculation is not None:
            actions.append(ConfirmTurn(speculation.turn_id))
            return actions + self._start_response(now, turn_id=speculation.turn_id)
        return actions + self._start_response(now)

    def _commit_audio(self, item_id: str, audio: np.ndarray) -> list[Action]:
        # A turn shorter than the audio encoder's minimum (a very short VAD turn, min_commit_ms 0) is
        # padded with silence: every committed item can be prompted.
        if audio.size < self.media.audio_min_samples:
            audio = np.pad(audio, (0, self.media.audio_min_samples - audio.size))
        item = MessageItem(role=Role.USER, content=(InputAudio(),), id=item_id, status=ItemStatus.COMPLETED)
        stored = StoredItem(item, (Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ),))
        previous = self.conversation.insert(stored)
        actions: list[Action] = [
            Send(InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous)),
            Send(ConversationItemAdded(item=item, previous_item_id=previous)),
            Send(ConversationItemDone(item=item, previous_item_id=previous)),
        ]
        if self.config.transcription is not None:
            self._transcriber.start(item_id, 0, stored.content[0], self.config.transcription)
        return actions + self._evict(item_id)

    # ---- responses ---------------------------------------------------------------------------
    def _spec(self, response_id: str, params: ce.ResponseParams | None) -> ResponseSpec:
        p = params or ce.ResponseParams()
        oob = p.conversation is ce.ConversationMode.NONE
        return ResponseSpec(
            response_id=response_id,
            voice=p.voice or self.config.voice,
            output_modalities=p.output_modalities or self.config.output_modalities,
            output_format=p.output_format or self.config.output_format,
            max_output_tokens=p.max_output_tokens or self.config.max_output_tokens,
            temperature=p.temperature if p.temperature is not None else self.config.temperature,
            conversation_id=None if oob else self.conversation_id,
            metadata=p.metadata,
        )

    def _turn_request(
        self, turn_id: str, spec: ResponseSpec, history: tuple[Message, ...], params: ce.ResponseParams | None
    ) -> TurnRequest:
        instructions = params.instructions if params is not None and params.instructions is not None else None
        if instructions is None:
            instructions = self.config.instructions
        max_tokens = spec.max_output_tokens
        tools, forced_prefix = engine_tools(*response_tools(self.config, params))
        return TurnRequest(
            turn_id=turn_id,
            conversation_id=spec.conversation_id or self._oob_conversation_id,
            history=history,
            system=instructions or None,
            sampling=SamplingParams(
                temperature=spec.temperature,
                max_tokens=self.settings.max_output_tokens if max_tokens == "inf" else max_tokens,
            ),
            voice=self._engine_voice(spec.voice) if spec.is_audio else None,
            with_audio=spec.is_audio,
            speed=self.config.speed,
            truncation=_engine_truncation(self.config.truncation),
            tools=tools,
            forced_prefix=forced_prefix,
        )

    def _engine_voice(self, voice: str) -> str:
        """The checkpoint voice that speaks `voice` (OpenAI aliases use the default voice)."""
        return voice if voice in self.voices else self._default_voice

    def _start_response(
        self,
        now: float,
        *,
        params: ce.ResponseParams | None = None,
        history: tuple[Message, ...] | None = None,
        turn_id: str | None = None,
    ) -> list[Action]:
        """Create the active response; submit its turn unless it is a confirmed speculation."""
        self._idle.disarm()
        spec = self._spec(turn_id or new_id(IdPrefix.RESPONSE), params)
        actions: list[Action] = []
        if turn_id is None:
            if spec.conversation_id is None:
                self._oob_used = True
            turn_history = history if history is not None else self.conversation.history()
            actions.append(SubmitTurn(self._turn_request(spec.response_id, spec, turn_history, params)))
        item = AssistantItem(new_id(IdPrefix.ITEM), is_audio=spec.is_audio)
        previous = self.conversation.last_id()
        if spec.conversation_id is not None:
            self.conversation.insert(item)
        response = ActiveResponse(
            spec, item, engine_rate_hz=OUTPUT_SAMPLE_RATE_HZ, frame_ms=self.settings.output_frame_ms,
            conversation=self.conversation if spec.conversation_id is not None else None,
            input_end_at=now, is_speculative=turn_id is not None,
        )
        if spec.conversation_id is None:
            self._oob[spec.response_id] = response
        else:
            self._response = response
        if spec.is_audio:
            self._has_spoken = True
        actions += [Send(e) for e in response.created_events(previous)]
        return actions

    def _response_of(self, turn_id: str) -> ActiveResponse | None:
        """The running response (default conversation or out of band) of engine turn `turn_id`."""
        if self._response is not None and self._response.id == turn_id:
            return self._response
        return self._oob.get(turn_id)

    def _forget(self, response: ActiveResponse) -> None:
        if response is self._response:
            self._response = None
        self._oob.pop(response.id, None)

    def _finish_response(
        self, status: ResponseStatus, now: float, *, response: ActiveResponse | None = None, **details
    ) -> list[Action]:
        response = response or self._response
        assert response is not None
        main = response is self._response
        self._forget(response)
        td = self.config.turn_detection
        if (main and isinstance(td, ServerVad) and td.idle_timeout_ms is not None
                and status is not ResponseStatus.CANCELLED):
            self._idle.arm(self._input.position_ms, response.item.audio_ms, td.idle_timeout_ms)
        events, record = response.finish(status, now, timing_events=self.config.timing_events, **details)
        trace_response(self.config, response.id, status, details.get("usage"))
        return [Send(e) for e in events] + [record] + self._evict()

    def _cancel_response(self, reason: StatusReason, now: float) -> list[Action]:
        """Barge-in or client cancel: stop the engine turn and end the response at once."""
        assert self._response is not None
        turn_id = self._response.id
        return [CancelTurn(turn_id)] + self._finish_response(ResponseStatus.CANCELLED, now, reason=reason)

    # ---- engine events -----------------------------------------------------------------------
    def handle_engine_event(self, event: TurnEvent, now: float) -> list[Action]:
        """Apply one engine event; output of turns that are no longer active is dropped."""
        if self._transcriber.owns(event.turn_id):
            return self._transcriber.on_engine_event(event)
        return self._on_engine_event(event, now) + self._release_transcriptions()

    def _release_transcriptions(self) -> list[Action]:
        return self._transcriber.release(self._response)

    def _on_engine_event(self, event: TurnEvent, now: float) -> list[Action]:
        response = self._response_of(event.turn_id)
        if response is None:
            return []
        if isinstance(event, TextDelta):
            return [Send(e) for e in response.on_text(event.text)]
        if isinstance(event, AudioChunk):
            return [Send(e) for e in response.on_audio(event.pcm, now)]
        if isinstance(event, StageMark):
            response.on_stage(event.stage, event.t)
            return []
        if isinstance(event, (ToolCallStart, ToolCallArguments, ToolCallEnd)):
            return [Send(e) for e in response.calls.on_event(event)]
        if isinstance(event, TurnDone):
            usage = usage_of(event)
            for stage, t in event.stages.items():
                response.on_stage(stage, t)
            malformed = response.calls.failure()
            if malformed is not None and not (event.finish_reason is FinishReason.LENGTH
                                              and response.calls.unterminated):
                return self._finish_response(ResponseStatus.FAILED, now, error=malformed, usage=usage)
            if event.finish_reason is FinishReason.LENGTH:
                return self._finish_response(
                    ResponseStatus.INCOMPLETE, now, response=response, reason=StatusReason.MAX_OUTPUT_TOKENS,
                    usage=usage,
                )
            return self._finish_response(ResponseStatus.COMPLETED, now, response=response, usage=usage)
        if isinstance(event, TurnCancelled):
            return self._finish_response(ResponseStatus.CANCELLED, now, response=response)
        assert isinstance(event, TurnFailed)
        return self._on_turn_failed(response, event, now)

    def _on_turn_failed(self, response: ActiveResponse, event: TurnFailed, now: float) -> list[Action]:
        """A failed response names its cause; unless the cause is transient (capacity, shutdown, a dead
        engine), the input items the turn added (the user/system items after the last assistant item) are
        removed from the conversation, each with `conversation.item.deleted`, so that the next response
        does not fail on them again."""
        error, transient = failure_error(response.id, event)
        log.warning("response %s failed in the engine (%s): %s", response.id, error.code, event.message)
        actions = self._finish_response(ResponseStatus.FAILED, now, response=response, error=error)
        if transient or response.spec.conversation_id is None:
            return actions
        new_inputs = []
        for entry in self.conversation.newest_first():
            if entry is response.item:
                continue
            if isinstance(entry, AssistantItem):
                break
            new_inputs.append(entry.id)
        for item_id in reversed(new_inputs):
            self.conversation.delete(item_id)
            actions += self._transcriber.forget_item(item_id)
            actions.append(Send(ConversationItemDeleted(item_id=item_id)))
        return actions


def _engine_truncation(value) -> Truncation:
    """The engine's truncation policy for the session's (validated) `truncation` value."""
    if isinstance(value, str):
        return Truncation(value)
    limits = value.get("token_limits") or {}
    return Truncation("retention_ratio", float(value["retention_ratio"]), limits.get("post_instructions"))


_HANDLERS: dict[type, Callable[[Session, ClientEvent, float], list[Action]]] = {
    ce.SessionUpdate: Session._on_session_update,
    ce.InputAudioBufferAppend: Session._on_append,
    ce.InputAudioBufferCommit: Session._on_commit,
    ce.InputAudioBufferClear: Session._on_clear,
    ce.ConversationItemCreate: Session._on_item_create,
    ce.ConversationItemRetrieve: Session._on_item_retrieve,
    ce.ConversationItemDelete: Session._on_item_delete,
    ce.ConversationItemTruncate: Session._on_item_truncate,
    ce.ResponseCreate: Session._on_response_create,
    ce.ResponseCancel: Session._on_response_cancel,
    ce.OutputAudioBufferClear: Session._on_output_audio_clear,
}
