"""The per-connection Realtime state machine (Sans-I/O).

`Session` takes parsed client events (or the `ProtocolError` a frame became), engine
`TurnEvent`s and the current monotonic time, and returns `Action`s: server events to send and
engine commands. It owns the input buffer, server_vad turns (speculative turns started at a
pause, confirmed at speech stop, discarded on resume), the conversation, the one active response,
barge-in and truncation. Nothing here touches a socket, a thread or a GPU.

`Session` dispatches and owns the state; the work per concern lives beside it as functions of the
session: `lifecycle` (creating, finishing and cancelling responses, out-of-band responses, engine
events, failed-turn cleanup), `items` (`conversation.item.*`) and `session_update` (`session.update`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np

from ..audio.pcm import AudioFormatError
from ..audio.turns import SpeechPaused, SpeechResumed
from ..audio.vad import VadBackend
from ..engine.api import Content, Message, PromptMeter, TurnEvent
from ..protocol import client_events as ce
from ..protocol.dialect import Dialect
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.events import ClientEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import InputAudio, ItemStatus, MessageItem, Role
from ..protocol.mcp import McpApprovalResponseItem, McpCallError, McpToolInfo
from ..protocol.responses import StatusReason
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    Error,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioBufferTimeoutTriggered,
    SessionCreated,
)
from ..protocol.session import SemanticVad, ServerVad, SessionConfig, SessionType
from . import items, lifecycle, mcp_flow, playout
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
from .barge_in import OutputGate, max_hold_s
from .config import SessionSettings
from .content import MediaLimits, stored_part
from .conversation import Conversation, StoredItem
from .failures import log_failure
from .idle import IdleTimer
from .input import BufferFull, InputTurns, SpeechBegan, SpeechEnded, TurnSignal
from .judgement import NO_ANSWER, TurnJudge
from .mcp_calls import McpServers
from .media_intake import MediaIntake
from .prompt_limits import PromptLimits
from .playback import Playback
from .response import ActiveResponse
from .session_update import on_session_update
from .transcription import Transcriber
from .voices import OPENAI_VOICE_ALIASES, SessionVoices, VoiceLookup

__all__ = ["OPENAI_VOICE_ALIASES", "Session"]

log = logging.getLogger(__name__)



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
        custom_voices: VoiceLookup | None = None,
        mcp_allowed_hosts: Collection[str] = (),
        prompt_meter: PromptMeter | None = None,
    ) -> None:
        self.settings = settings
        self.mcp_allowed_hosts = frozenset(mcp_allowed_hosts)  # server.mcp.allowed_hosts
        self.prompt_limits = PromptLimits(prompt_meter, settings)  # token budgets checked where settings come in
        self.media = media or MediaLimits(min_audio_ms=settings.min_commit_ms, max_audio_s=settings.max_input_audio_s)
        self.dialect = dialect
        self.voices = tuple(voices)
        self._default_voice = default_voice
        self._accepted_voices = SessionVoices(self.voices, default_voice, custom_voices)
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
            output_lead_ms=settings.output_lead_ms,
        )
        self.conversation_id = new_id(IdPrefix.CONVERSATION)
        self.conversation = Conversation(settings.max_items, self.media.max_conversation_bytes)
        self._intake = MediaIntake(self.media)  # the media rates; the current event's decoded media
        self._input = InputTurns(vad, make_vad, settings.max_input_audio_s)
        self._input.configure(self.config.input_format, self.config.turn_detection)
        self._speculation: _Speculation | None = None
        # the reply's output on its way to the listener: paced to the client's playback, held while a barge-in is judged
        self._gate = OutputGate(max_hold_s(vad.detector))
        self._playback = Playback()  # what the client plays: the barge-in guard follows it (`playout`)
        # the transport plays the audio out and says `output_audio_buffer.*` itself (a WebRTC call): the session
        # then never does (set by the connection)
        self.transport_playout = False
        self._response: ActiveResponse | None = None  # the one response of the default conversation
        self._oob: dict[str, ActiveResponse] = {}  # out-of-band responses running beside it, by id
        self._idle = IdleTimer()  # GA turn_detection.idle_timeout_ms
        self._has_spoken = False  # the voice is fixed after the first audio response
        self._oob_used = False
        self._transcriber = Transcriber(self.conversation, self.conversation_id)
        self._judge = TurnJudge(self.conversation_id)  # semantic_vad's words judgement (`set_turn_judgement`)
        self._served_model = model
        self.mcp = McpServers(self.conversation)  # remote MCP servers: listings, calls, approvals

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
        actions += self._transcriber.close() + self._judge.close()
        self.mcp.close()
        actions.append(CloseConversation(self.conversation_id))
        if self._oob_used:
            actions.append(CloseConversation(self._oob_conversation_id))
        return actions

    def set_turn_judgement(self, available: bool) -> None:
        """Whether the engine judges the user's words at a pause (`TurnTask.JUDGE_TURN`): semantic_vad then asks
        it with each speculative reply and combines it with prosody (`judgement.py`)."""
        self._judge.available = available
        self._input.words_judged = available

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
        before, oob_before = self._response, set(self._oob)
        try:  # every way out drops what `predecode` kept for this event
            handler = _HANDLERS.get(type(event))
            if handler is None:
                return self._error(ErrorCode.UNSUPPORTED_EVENT, event.event_id, event_type=event.type)
            if self._no_responses(event):
                return self._error(ErrorCode.TRANSCRIPTION_SESSION_NO_RESPONSE, event.event_id, param="type")
            return handler(self, event, now) + playout.sync_output(self, now) + self._release_transcriptions()
        except ProtocolError as error:
            return [Send(Error.from_protocol_error(error.with_event_id(event.event_id)))]
        except Exception as exc:  # a bug must cost this request, never the session
            log_failure(log, self.config.id, event.type, event.event_id, exc)
            return lifecycle.drop_responses_since(self, before, oob_before) + self._error(
                ErrorCode.SERVER_ERROR, event.event_id)

        finally:
            self._intake.clear()

    def predecode(self, event: ClientEvent | ProtocolError, now: float) -> None:
        """Decode the media of `event` ahead of `handle_client_event` (its next call consumes them).

        Safe to run on a worker thread while the session is otherwise idle (the runner awaits it before
        handling the event): it reads the input format and the limits and takes the media rates
        (`MediaIntake.predecode`). Lets the event loop stay responsive while images and clips decode; an
        event over the image or video rate is not decoded (a client flooding media does not occupy the
        decoder threads all sessions share).
        """
        if not self._no_responses(event):
            self._intake.predecode(event, now, self.config.input_format)

    def _no_responses(self, event: object) -> bool:
        """A `response.create` in a transcription session: refused before anything of it is read."""
        return isinstance(event, ce.ResponseCreate) and self.config.session_type is SessionType.TRANSCRIPTION

    def _admit_media(self, event: ce.ConversationItemCreate | ce.ResponseCreate, now: float) -> None:
        """Take the media rates of `event` before any of it is decoded (`MediaIntake.admit`)."""
        self._intake.admit(event, now)

    def abort_response(self, turn_id: str, now: float) -> list[Action]:
        """Handling the output of `turn_id` failed unexpectedly: stop its engine turn and end its
        response `failed` with `server_error` (the next response works). No-op for a turn that
        is not the active response's."""
        return lifecycle.abort_response(self, turn_id, now)

    def _error(self, code: ErrorCode, event_id: str | None, *, param: str | None = None, **values: object) -> list[Action]:
        return [Send(Error.from_protocol_error(ProtocolError(code, param=param, event_id=event_id, **values)))]

    def _on_append(self, event: ce.InputAudioBufferAppend, now: float) -> list[Action]:
        td = self.config.turn_detection
        # while Ming is heard (or a reply is generated) only a real interruption starts a turn
        self._input.guard_barge_in(td is not None and td.interrupt_response and playout.speaking(self, now))
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
        actions += self._discard_speculation() + self._commit_audio(item_id, audio)
        return actions + lifecycle.start_response(self, now)

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

    def _evict(self, *keep: str | None) -> list[Action]:
        """Apply the conversation's bounds (items, bytes): the oldest items go, each announced."""
        active = None if self._response is None else self._response.item.id
        return [Send(ConversationItemDeleted(item_id=i)) for i in self.conversation.evict((*keep, active))]

    def _store_item(self, item, param: str) -> StoredItem:
        """Assign id/status and decode the model view of a client item; raises ProtocolError."""
        if isinstance(item, McpApprovalResponseItem):  # it must answer a request that waits (docs §4.2)
            self.mcp.check_answer(item, param)
            return StoredItem(replace(item, id=item.id or new_id(IdPrefix.ITEM)))
        item = replace(item, id=item.id or new_id(IdPrefix.ITEM), status=ItemStatus.COMPLETED)
        if not isinstance(item, MessageItem):
            return StoredItem(item)
        fmt = self.config.input_format
        contents = tuple(self._intake.content(part, f"{param}.content[{i}]", fmt) for i, part in enumerate(item.content))
        parts = tuple(stored_part(p, self._intake.measured(p)) for p in item.content)  # clips measured by `admit`
        return StoredItem(replace(item, content=parts), contents)

    # ---- turns -------------------------------------------------------------------------------
    def _on_turn_signal(self, signal: TurnSignal, now: float) -> list[Action]:
        td = self.config.turn_detection
        assert isinstance(td, ServerVad | SemanticVad)
        if isinstance(signal, SpeechBegan):
            self._idle.disarm()
            actions: list[Action] = [Send(InputAudioBufferSpeechStarted(
                audio_start_ms=signal.audio_start_ms, item_id=signal.item_id
            ))]
            if td.interrupt_response:  # the client stops playing now (`playout.interrupted`)
                cancelled = self.active_response_id
                if cancelled is not None:
                    actions += lifecycle.cancel_response(self, StatusReason.TURN_DETECTED, now)
                actions += playout.interrupted(self, now, cancelled)
            return actions
        if isinstance(signal, SpeechPaused):
            if self._auto_respond(td) and self._response is None and self._speculation is None:
                return self._speculate(now)
            return []
        if isinstance(signal, SpeechResumed):  # the user goes on: the pause's reply and judgement are obsolete
            return self._discard_speculation() + self._judge.cancel_all()
        assert isinstance(signal, SpeechEnded)
        return self._judge.cancel_all() + self._on_speech_ended(signal, td, now)

    def _speculate(self, now: float) -> list[Action]:
        """Submit the turn as heard so far; its output is held until speech stop confirms it."""
        audio = self._input.speech_so_far()
        turn_id = new_id(IdPrefix.RESPONSE)
        self._speculation = _Speculation(turn_id, audio)
        user = Message(Role.USER.value, (Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ),))
        spec = lifecycle.spec_for(self, turn_id, None)
        request = replace(lifecycle.turn_request(self, turn_id, spec, self.conversation.history() + (user,), None),
                          speculative=True)
        self._transcriber.note_reply(request)  # the transcription of this audio reuses its prefill
        actions: list[Action] = [SubmitTurn(request)]
        if self._judge.available and isinstance(self.config.turn_detection, SemanticVad):
            judge_id = self._judge.new_turn_id()  # forks the reply's prefill: submitted after it
            if self._input.expect_judgement(judge_id):
                actions += self._judge.submit(judge_id, request)
        return actions

    def _auto_respond(self, td: ServerVad | SemanticVad) -> bool:
        """Whether a VAD turn starts a response (never in a transcription session: it only transcribes)."""
        return td.create_response and self.config.session_type is SessionType.REALTIME

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
        if not self._auto_respond(td) or self._response is not None:
            if speculation is not None:
                actions.append(DiscardTurn(speculation.turn_id))
            return actions
        if speculation is not None:
            actions.append(ConfirmTurn(speculation.turn_id))
            return actions + lifecycle.start_response(self, now, turn_id=speculation.turn_id)
        return actions + lifecycle.start_response(self, now)

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

    @property
    def words_deadline(self) -> float | None:
        """Monotonic s at which semantic_vad stops waiting for the words judgement of a turn prosody judged complete:
        call `on_decision_ready` then (None: not waiting)."""
        return self._input.words_deadline

    @property
    def pending_decision(self) -> Future | None:
        """semantic_vad's end-of-turn call that a passed decision point waits for: call
        `on_decision_ready` once it is done (the client may send no more audio meanwhile)."""
        return self._input.pending_decision

    def on_decision_ready(self, now: float) -> list[Action]:
        """The pending end-of-turn call finished, or `words_deadline` passed: end the turn now if it is complete."""
        actions: list[Action] = []
        for signal in self._input.poll():
            actions += self._on_turn_signal(signal, now)
        return actions

    # ---- engine events -----------------------------------------------------------------------
    def handle_engine_event(self, event: TurnEvent, now: float) -> list[Action]:
        """Apply one engine event; output of turns that are no longer active is dropped."""
        if self._transcriber.owns(event.turn_id):
            return self._transcriber.on_engine_event(event)
        if self._judge.owns(event.turn_id):
            return self._on_judgement(event, now)
        actions = playout.sync_output(self, now) if self._gate.active else []
        response = self._response
        if response is not None and event.turn_id == response.id:  # on its way to the listener, paced or held
            actions += playout.on_engine_event(self, response, event, now)
        else:
            actions += lifecycle.on_engine_event(self, event, now)
        return actions + self._release_transcriptions()

    @property
    def output_deadline(self) -> float | None:
        """Monotonic s at which to call `on_output_timer` even if no input comes (a paced audio piece is due, an
        output hold expires, a reply has played out); None: nothing to wait for."""
        return playout.output_deadline(self)

    def on_output_timer(self, now: float) -> list[Action]:
        """`output_deadline` passed: send the output that is due."""
        return playout.sync_output(self, now) + self._release_transcriptions()

    def _on_judgement(self, event: TurnEvent, now: float) -> list[Action]:
        """An event of a words judgement: its answer (or its failure: prosody alone) may end the turn now."""
        answer, actions = self._judge.on_engine_event(event)
        if answer is not NO_ANSWER:
            for signal in self._input.on_judgement(event.turn_id, answer):
                actions += self._on_turn_signal(signal, now)
        return actions

    def on_mcp_listed(self, item_id: str, outcome: tuple[McpToolInfo, ...] | McpCallError, now: float) -> list[Action]:
        """A `ListMcpTools` action ended (its tools, or why not)."""
        return mcp_flow.on_listed(self, item_id, outcome)

    def on_mcp_called(self, item_id: str, outcome: str | McpCallError, now: float) -> list[Action]:
        """A `CallMcpTool` action ended (its output, or why not)."""
        return mcp_flow.on_called(self, item_id, outcome, now)

    def _release_transcriptions(self) -> list[Action]:
        return self._transcriber.release(self._response)


_HANDLERS: dict[type, Callable[[Session, ClientEvent, float], list[Action]]] = {
    ce.SessionUpdate: on_session_update,
    ce.InputAudioBufferAppend: Session._on_append,
    ce.InputAudioBufferCommit: Session._on_commit,
    ce.InputAudioBufferClear: Session._on_clear,
    ce.ConversationItemCreate: items.on_item_create,
    ce.ConversationItemRetrieve: items.on_item_retrieve,
    ce.ConversationItemDelete: items.on_item_delete,
    ce.ConversationItemTruncate: items.on_item_truncate,
    ce.ResponseCreate: lifecycle.on_response_create,
    ce.ResponseCancel: lifecycle.on_response_cancel,
    ce.OutputAudioBufferClear: playout.on_output_audio_clear,
}
