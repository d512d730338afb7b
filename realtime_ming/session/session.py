"""The per-connection Realtime state machine (Sans-I/O).

`Session` takes parsed client events (or the `ProtocolError` a frame became), engine
`TurnEvent`s and the current monotonic time, and returns `Action`s: server events to send and
engine commands. Nothing here touches a socket, a thread or a GPU.

`Session` dispatches; objects own the state and the work per concern, composed here and handed the
collaborators they need (never the session): the input turns (`input.InputTurns`) and what they do
(`turn_taking.TurnTaking`), the speculative turn (`speculative.Speculation`), the conversation
(`conversation.Conversation`, edited by `items.ItemEvents`), the responses (`lifecycle.Responses`), the
listener's side (`playout.Playout` over the barge-in `barge_in.OutputGate` and the `playback.Playback` clocks),
the MCP servers, transcriptions and turn judgements; `session_update` checks a `session.update`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future

from ..audio.pcm import AudioFormatError
from ..audio.vad import VadBackend
from ..engine.api import PromptMeter, TurnEvent
from ..protocol import client_events as ce
from ..protocol.audio_input import ServerVad
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.mcp import McpCallError, McpToolInfo
from ..protocol.server_events import Error, InputAudioBufferCleared, SessionCreated, SessionUpdated
from ..protocol.session import SessionConfig, SessionType
from . import mcp_flow
from .actions import Action, CloseConversation, Send, error_reply
from .barge_in import OutputGate, max_hold_s, max_pause_s
from .config import SessionSettings
from .content import MediaLimits
from .conversation import Conversation
from .failures import log_failure
from .idle import IdleTimer
from .input import BufferFull, InputTurns
from .items import ItemEvents
from .judgement import TurnJudge
from .lifecycle import Responses
from .mcp_calls import McpServers
from .media_intake import MediaIntake
from .playback import Playback
from .playout import Playout
from .prompt_limits import PromptLimits
from .session_update import UpdateRefused, UpdateRules, updated_config
from .speculative import Speculation
from .transcription import Transcriber
from .turn_taking import TurnTaking
from .voices import OPENAI_VOICE_ALIASES, SessionVoices, VoiceLookup

__all__ = ["OPENAI_VOICE_ALIASES", "Session"]

log = logging.getLogger(__name__)


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
        self._mcp_allowed_hosts = frozenset(mcp_allowed_hosts)  # server.mcp.allowed_hosts
        self.prompt_limits = PromptLimits(prompt_meter, settings)  # token budgets checked where settings come in
        self.media = media or MediaLimits(min_audio_ms=settings.min_commit_ms, max_audio_s=settings.max_input_audio_s)
        self.dialect = dialect
        self.voices = tuple(voices)
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
        self._speculation = Speculation()
        # the reply's output on its way to the listener: paced to the client's playback, held while a barge-in is judged
        self._gate = OutputGate(max_hold_s(vad.detector), max_pause_s(vad.detector))
        self._playback = Playback()  # what the client plays: the barge-in guard follows it (`playout`)
        self._idle = IdleTimer()  # GA turn_detection.idle_timeout_ms
        self._transcriber = Transcriber(self.conversation, self.conversation_id)
        self._judge = TurnJudge(self.conversation_id)  # semantic_vad's words judgement (`set_turn_judgement`)
        self.mcp = McpServers(self.conversation)  # remote MCP servers: listings, calls, approvals
        self._update_rules = UpdateRules(self._accepted_voices, model, self._mcp_allowed_hosts, self.prompt_limits)
        current = self._current_config  # a session.update replaces the configuration: its holders read it here
        self.responses = Responses(
            settings=settings, config=current, dialect=dialect, conversation=self.conversation,
            conversation_id=self.conversation_id, voices=self._accepted_voices, prompt_limits=self.prompt_limits,
            mcp=self.mcp, mcp_allowed_hosts=self._mcp_allowed_hosts, intake=self._intake, transcriber=self._transcriber,
            speculation=self._speculation, playback=self._playback, gate=self._gate, idle=self._idle,
            input_ms=lambda: self._input.position_ms,
        )
        self.playout = Playout(gate=self._gate, playback=self._playback, responses=self.responses, config=current,
                               conversation=self.conversation, speculation=self._speculation,
                               judging=lambda: self._input.judging_barge_in,
                               word_over=lambda: self._input.barge_in_word_over)
        self._turns = TurnTaking(config=current, input_turns=self._input, speculation=self._speculation,
                                 responses=self.responses, playout=self.playout, conversation=self.conversation,
                                 transcriber=self._transcriber, judge=self._judge, idle=self._idle,
                                 audio_min_samples=self.media.audio_min_samples)
        items = ItemEvents(conversation=self.conversation, config=current, intake=self._intake, mcp=self.mcp,
                           responses=self.responses, playout=self.playout, speculation=self._speculation,
                           transcriber=self._transcriber)
        self._handlers: dict[type, Callable[[ClientEvent, float], list[Action]]] = {
            ce.SessionUpdate: self._on_session_update,
            ce.InputAudioBufferAppend: self._on_append,
            ce.InputAudioBufferCommit: self._on_commit,
            ce.InputAudioBufferClear: self._on_clear,
            ce.ConversationItemCreate: items.on_create,
            ce.ConversationItemRetrieve: items.on_retrieve,
            ce.ConversationItemDelete: items.on_delete,
            ce.ConversationItemTruncate: items.on_truncate,
            ce.ResponseCreate: self.responses.on_create,
            ce.ResponseCancel: self.responses.on_cancel,
            ce.OutputAudioBufferClear: self.playout.on_clear,
        }

    def _current_config(self) -> SessionConfig:
        return self.config

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> list[Action]:
        """The first server event: `session.created` with the default session."""
        return [Send(SessionCreated(session=self.config))]

    def close(self) -> list[Action]:
        """The connection is gone: stop and free everything this session holds in the engine."""
        actions = self._speculation.discard() + self.responses.close()
        actions += self._transcriber.close() + self._judge.close()
        self.mcp.close()
        actions.append(CloseConversation(self.conversation_id))
        if self.responses.oob_used:
            actions.append(CloseConversation(self.responses.oob_conversation_id))
        return actions

    def set_turn_judgement(self, available: bool) -> None:
        """Whether the engine judges the user's words at a pause (`TurnTask.JUDGE_TURN`): semantic_vad then asks
        it with each speculative reply and combines it with prosody (`judgement.py`)."""
        self._judge.available = available
        self._input.words_judged = available

    @property
    def active_response_id(self) -> str | None:
        """Id of the response being generated, if any."""
        active = self.responses.active
        return None if active is None else active.id

    @property
    def mcp_allowed_hosts(self) -> frozenset[str]:
        """The hosts a remote MCP server may be on (`server.mcp.allowed_hosts`; empty: none)."""
        return self._mcp_allowed_hosts

    @property
    def transport_playout(self) -> bool:
        """The transport plays the audio out and says `output_audio_buffer.*` itself (a WebRTC call): the session
        then never does (set by the connection)."""
        return self.playout.transport_playout

    @transport_playout.setter
    def transport_playout(self, value: bool) -> None:
        self.playout.transport_playout = value

    # ---- client events -----------------------------------------------------------------------
    def handle_client_event(self, event: ClientEvent | ProtocolError, now: float) -> list[Action]:
        """Apply one parsed client event (or report the error its frame became)."""
        if isinstance(event, ProtocolError):
            return [Send(Error.from_protocol_error(event))]
        before = self.responses.snapshot()
        try:  # every way out drops what `predecode` kept for this event
            handler = self._handlers.get(type(event))
            if handler is None:
                return error_reply(ErrorCode.UNSUPPORTED_EVENT, event.event_id, event_type=event.type)
            if self._no_responses(event):
                return error_reply(ErrorCode.TRANSCRIPTION_SESSION_NO_RESPONSE, event.event_id, param="type")
            return handler(event, now) + self.playout.sync(now) + self._release_transcriptions()
        except ProtocolError as error:
            return [Send(Error.from_protocol_error(error.with_event_id(event.event_id)))]
        except Exception as exc:  # a bug must cost this request, never the session
            log_failure(log, self.config.id, event.type, event.event_id, exc)
            return self.responses.drop_since(*before) + error_reply(ErrorCode.SERVER_ERROR, event.event_id)
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

    def abort_response(self, turn_id: str, now: float) -> list[Action]:
        """Handling the output of `turn_id` failed unexpectedly: stop its engine turn and end its
        response `failed` with `server_error` (the next response works). No-op for a turn that
        is not the active response's."""
        return self.responses.abort(turn_id, now)

    def _on_session_update(self, event: ce.SessionUpdate, now: float) -> list[Action]:
        try:
            new = updated_config(self.config, event, self._update_rules, responding=self.responses.responding,
                                 has_spoken=self.responses.has_spoken, input_turns=self._input)
        except UpdateRefused as refused:
            return [Send(Error.from_protocol_error(refused.error.with_event_id(event.event_id)))]
        old, self.config = self.config, new
        if new.voice != old.voice:
            self._accepted_voices.hold(new.voice)
        actions = self._speculation.discard()
        if (new.input_format, new.turn_detection) != (old.input_format, old.turn_detection):
            self._input.configure(new.input_format, new.turn_detection)
        actions.append(Send(SessionUpdated(session=new)))
        return actions + self.mcp.list_new(new.tools)

    def _on_append(self, event: ce.InputAudioBufferAppend, now: float) -> list[Action]:
        td = self.config.turn_detection
        # while Ming is heard (or a reply is generated) only a real interruption starts a turn
        self._input.guard_barge_in(td is not None and td.interrupt_response and self.playout.speaking(now))
        try:
            signals = self._input.append(event.audio)
        except AudioFormatError as exc:
            return error_reply(ErrorCode.INVALID_AUDIO, event.event_id, param="audio", detail=str(exc))
        except BufferFull:
            return error_reply(ErrorCode.INPUT_AUDIO_BUFFER_TOO_LARGE, event.event_id, param="audio",
                               max_s=self.settings.max_input_audio_s)
        actions: list[Action] = []
        for signal in signals:
            actions += self._turns.on_signal(signal, now)
        return actions + self._turns.check_idle(now)

    def _on_commit(self, event: ce.InputAudioBufferCommit, now: float) -> list[Action]:
        # The resampler holds back its filter delay (up to 85 ms for 8 kHz G.711): the commit
        # ends the stream, so that tail belongs to this turn.
        self._input.flush()
        buffered_ms = self._input.buffered_ms
        if buffered_ms < self.settings.min_commit_ms:
            return error_reply(ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY, event.event_id,
                               min_ms=self.settings.min_commit_ms, buffered_ms=buffered_ms)
        item_id, audio = self._input.commit()
        return self._speculation.discard() + self._turns.commit_audio(item_id, audio)

    def _on_clear(self, event: ce.InputAudioBufferClear, now: float) -> list[Action]:
        self._input.clear(reset_decoder=True)
        return self._speculation.discard() + [Send(InputAudioBufferCleared())]

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
        return self._turns.poll(now)

    # ---- engine events -----------------------------------------------------------------------
    def handle_engine_event(self, event: TurnEvent, now: float) -> list[Action]:
        """Apply one engine event; output of turns that are no longer active is dropped."""
        if self._transcriber.owns(event.turn_id):
            return self._transcriber.on_engine_event(event)
        if self._judge.owns(event.turn_id):
            return self._turns.on_judgement(event, now)
        actions = self.playout.sync(now) if self.playout.holding else []
        response = self.responses.active
        if response is not None and event.turn_id == response.id:  # on its way to the listener, paced or held
            actions += self.playout.on_engine_event(response, event, now)
        else:
            actions += self.responses.on_engine_event(event, now)
        return actions + self._release_transcriptions()

    @property
    def output_deadline(self) -> float | None:
        """Monotonic s at which to call `on_output_timer` even if no input comes (a paced audio piece is due, an
        output hold expires, a reply has played out); None: nothing to wait for."""
        return self.playout.deadline()

    def on_output_timer(self, now: float) -> list[Action]:
        """`output_deadline` passed: send the output that is due."""
        return self.playout.sync(now) + self._release_transcriptions()

    def on_mcp_listed(self, item_id: str, outcome: tuple[McpToolInfo, ...] | McpCallError, now: float) -> list[Action]:
        """A `ListMcpTools` action ended (its tools, or why not)."""
        return self.mcp.on_listed(item_id, outcome)

    def on_mcp_called(self, item_id: str, outcome: str | McpCallError, now: float) -> list[Action]:
        """A `CallMcpTool` action ended (its output, or why not)."""
        return mcp_flow.on_called(self.responses, self.mcp, self.conversation, item_id, outcome, now)

    def _release_transcriptions(self) -> list[Action]:
        return self._transcriber.release(self.responses.active)
