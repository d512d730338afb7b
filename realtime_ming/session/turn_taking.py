"""Turn-taking of a session's input: what a committed or detected user turn does to the conversation and the
responses (`TurnTaking`).

`input.InputTurns` hears the audio and says where turns begin, pause, resume and end (server_vad, semantic_vad);
`TurnTaking` answers: `speech_started` (and, with interrupt_response, the reply it cuts off), a speculative reply
at a pause (`speculative.Speculation`, with a words judgement for semantic_vad: `judgement.TurnJudge`), the user
item at the end, confirmed or fresh response; and the idle timeout's prompt (GA `idle_timeout_ms`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..audio.turns import SpeechPaused, SpeechResumed
from ..engine.api import Content, Message, TurnEvent
from ..protocol.audio_input import SemanticVad, ServerVad
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import InputAudio, ItemStatus, MessageItem, Role
from ..protocol.responses import StatusReason
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDone,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioBufferTimeoutTriggered,
)
from ..protocol.session import SessionConfig, SessionType
from .actions import Action, ConfirmTurn, DiscardTurn, Send, SubmitTurn
from .audio_io import MODEL_SAMPLE_RATE_HZ
from .conversation import Conversation, StoredItem
from .idle import IdleTimer
from .input import InputTurns, SpeechBegan, SpeechEnded, TurnSignal
from .judgement import NO_ANSWER, TurnJudge
from .lifecycle import Responses
from .playout import Playout
from .speculative import Speculation
from .transcription import Transcriber

__all__ = ["TurnTaking"]


class TurnTaking:
    """The user's turns of one session (not thread-safe). `config` gives the session's current configuration;
    `audio_min_samples` is the audio encoder's shortest input (a shorter turn is padded with silence)."""

    def __init__(self, *, config: Callable[[], SessionConfig], input_turns: InputTurns, speculation: Speculation,
                 responses: Responses, playout: Playout, conversation: Conversation, transcriber: Transcriber,
                 judge: TurnJudge, idle: IdleTimer, audio_min_samples: int) -> None:
        self._config, self._input, self._speculation = config, input_turns, speculation
        self._responses, self._playout, self._conversation = responses, playout, conversation
        self._transcriber, self._judge, self._idle = transcriber, judge, idle
        self._audio_min_samples = audio_min_samples

    def poll(self, now: float) -> list[Action]:
        """The pending end-of-turn call finished, or the words deadline passed: end the turn now if it is complete."""
        actions: list[Action] = []
        for signal in self._input.poll():
            actions += self.on_signal(signal, now)
        return actions

    def check_idle(self, now: float) -> list[Action]:
        """idle_timeout_ms passed since the last reply played out: commit the idle input, prompt the user."""
        span = self._idle.expired(self._input.position_ms)
        if span is None or self._responses.active is not None or self._input.in_speech:
            return []
        item_id, audio = self._input.commit()
        actions: list[Action] = [Send(InputAudioBufferTimeoutTriggered(
            audio_start_ms=span[0], audio_end_ms=span[1], item_id=item_id))]
        actions += self._speculation.discard() + self.commit_audio(item_id, audio)
        return actions + self._responses.start(now)

    def on_signal(self, signal: TurnSignal, now: float) -> list[Action]:
        td = self._config().turn_detection
        assert isinstance(td, ServerVad | SemanticVad)
        if isinstance(signal, SpeechBegan):
            self._idle.disarm()
            actions: list[Action] = [Send(InputAudioBufferSpeechStarted(
                audio_start_ms=signal.audio_start_ms, item_id=signal.item_id
            ))]
            if td.interrupt_response:  # the client stops playing now (`playout.interrupted`)
                active = self._responses.active
                cancelled = None if active is None else active.id
                if cancelled is not None:
                    actions += self._responses.cancel(StatusReason.TURN_DETECTED, now)
                actions += self._playout.interrupted(now, cancelled)
            return actions
        if isinstance(signal, SpeechPaused):
            if self._auto_respond(td) and self._responses.active is None and not self._speculation.pending:
                return self._speculate(now)
            return []
        if isinstance(signal, SpeechResumed):  # the user goes on: the pause's reply and judgement are obsolete
            return self._speculation.discard() + self._judge.cancel_all()
        assert isinstance(signal, SpeechEnded)
        return self._judge.cancel_all() + self._on_speech_ended(signal, td, now)

    def _speculate(self, now: float) -> list[Action]:
        """Submit the turn as heard so far; its output is held until speech stop confirms it."""
        audio = self._input.speech_so_far()
        turn_id = new_id(IdPrefix.RESPONSE)
        self._speculation.begin(turn_id, audio)
        user = Message(Role.USER.value, (Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ),))
        spec = self._responses.spec_for(turn_id, None)
        request = replace(self._responses.turn_request(turn_id, spec, self._conversation.history() + (user,), None),
                          speculative=True)
        self._transcriber.note_reply(request)  # the transcription of this audio reuses its prefill
        actions: list[Action] = [SubmitTurn(request)]
        if self._judge.available and isinstance(self._config().turn_detection, SemanticVad):
            judge_id = self._judge.new_turn_id()  # forks the reply's prefill: submitted after it
            if self._input.expect_judgement(judge_id):
                actions += self._judge.submit(judge_id, request)
        return actions

    def _auto_respond(self, td: ServerVad | SemanticVad) -> bool:
        """Whether a VAD turn starts a response (never in a transcription session: it only transcribes)."""
        return td.create_response and self._config().session_type is SessionType.REALTIME

    def _on_speech_ended(self, signal: SpeechEnded, td: ServerVad | SemanticVad, now: float) -> list[Action]:
        actions: list[Action] = [
            Send(InputAudioBufferSpeechStopped(audio_end_ms=signal.audio_end_ms, item_id=signal.item_id))
        ]
        speculation = self._speculation.take()
        # The user item holds exactly the audio a speculative turn heard, so the engine's cached
        # prefix matches the history of the next turn.
        audio = speculation.audio if speculation is not None else signal.audio
        actions += self.commit_audio(signal.item_id, audio)
        if not self._auto_respond(td) or self._responses.active is not None:
            if speculation is not None:
                actions.append(DiscardTurn(speculation.turn_id))
            return actions
        if speculation is not None:
            actions.append(ConfirmTurn(speculation.turn_id))
            return actions + self._responses.start(now, turn_id=speculation.turn_id)
        return actions + self._responses.start(now)

    def commit_audio(self, item_id: str, audio: np.ndarray) -> list[Action]:
        # A turn shorter than the audio encoder's minimum (a very short VAD turn, min_commit_ms 0) is
        # padded with silence: every committed item can be prompted.
        if audio.size < self._audio_min_samples:
            audio = np.pad(audio, (0, self._audio_min_samples - audio.size))
        item = MessageItem(role=Role.USER, content=(InputAudio(),), id=item_id, status=ItemStatus.COMPLETED)
        stored = StoredItem(item, (Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ),))
        previous = self._conversation.insert(stored)
        actions: list[Action] = [
            Send(InputAudioBufferCommitted(item_id=item_id, previous_item_id=previous)),
            Send(ConversationItemAdded(item=item, previous_item_id=previous)),
            Send(ConversationItemDone(item=item, previous_item_id=previous)),
        ]
        if self._config().transcription is not None:
            self._transcriber.start(item_id, 0, stored.content[0], self._config().transcription)
        return actions + self._responses.evict(item_id)

    def on_judgement(self, event: TurnEvent, now: float) -> list[Action]:
        """An event of a words judgement: its answer (or its failure: prosody alone) may end the turn now."""
        answer, actions = self._judge.on_engine_event(event)
        if answer is not NO_ANSWER:
            for signal in self._input.on_judgement(event.turn_id, answer):
                actions += self.on_signal(signal, now)
        return actions
