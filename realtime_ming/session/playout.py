"""The listener's side of a `Session`: the reply's output paced and held (`barge_in.OutputGate`), the playback
clocks (`playback.PlaybackClock`) and what corrects them, the GA `output_audio_buffer.*` events.

`Playout` follows them for the session (docs/barge_in.md); the gate and the clocks own their state, the
responses (`lifecycle.Responses`) theirs:

* `speaking` — Ming is heard now (or a reply is being generated): the barge-in guard follows it;
* `on_engine_event` / `pump` — the default conversation's engine events through the gate;
* `deadline` / `sync` — when the session must act without an input (a paced piece is due, a hold
  expires or has paused the listener for `barge_in_max_pause_ms`, a reply has played out) and what it does then;
* `interrupted`, `client_stopped`, `on_clear` — the client stopped playing: at an interruption's
  `speech_started`, at its `conversation.item.truncate`, at its `output_audio_buffer.clear`.

`output_audio_buffer.started` / `.stopped` / `.cleared` go to a WebSocket session that asks for them
(`realtime_ming.output_audio_buffer`; a WebRTC call's playout sends its own): started with a response's first audio delta,
stopped once it is done and its audio has played out, cleared when it was cut off (an interruption, or the client's
clear, which is always answered with it). Where the server tracks playout it also truncates the item at the
played position itself on an interruption, as OpenAI does over WebRTC.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engine.api import AudioChunk, FinishReason, StageMark, TurnCancelled, TurnDone, TurnEvent, TurnFailed
from ..protocol import client_events as ce
from ..protocol.error_codes import ErrorCode
from ..protocol.responses import StatusReason
from ..protocol.server_events import (
    ConversationItemTruncated,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
)
from ..protocol.session import SessionConfig
from .actions import Action, Send, error_reply
from .barge_in import OutputGate, Waiting, WireAudio
from .conversation import AssistantItem, Conversation
from .lifecycle import Responses
from .playback import Playback, PlaybackClock
from .response import ActiveResponse
from .speculative import Speculation

__all__ = ["Playout"]

_EPS_S = 1e-6  # a piece due "now" is never kept back by float rounding


class Playout:
    """The listener's side of one session (not thread-safe). `config` gives the session's current configuration,
    `judging` whether its input's barge-in detector is judging a speech candidate now, `word_over` whether that
    candidate's one word is over (`TurnDetector.barge_in_word_over`: the hold may end at the pause bound)."""

    def __init__(self, *, gate: OutputGate, playback: Playback, responses: Responses,
                 config: Callable[[], SessionConfig], conversation: Conversation, speculation: Speculation,
                 judging: Callable[[], bool], word_over: Callable[[], bool]) -> None:
        self._gate, self._playback, self._responses = gate, playback, responses
        self._config, self._conversation, self._speculation, self._judging = config, conversation, speculation, judging
        self._word_over = word_over
        # the transport plays the audio out and says `output_audio_buffer.*` itself (a WebRTC call): the session
        # then never does (set by the connection)
        self.transport_playout = False

    @property
    def holding(self) -> bool:
        """The output is held while a barge-in is judged (the gate's events wait)."""
        return self._gate.active

    def speaking(self, now: float) -> bool:
        """A reply is being generated, or its audio still plays at the client: the barge-in guard is on."""
        return self._responses.active is not None or self._playback.playing(now)

    # ---- engine output ----------------------------------------------------------------------------------------
    def on_engine_event(self, response: ActiveResponse, event: TurnEvent, now: float) -> list[Action]:
        """An engine event of the default conversation's response `response`: queued in the gate, then everything
        that may go out now goes. Stage marks are bookkeeping and apply at once (a turn's end stages too: the
        timings say when generation ended, whatever still waits); a failure or a cancel sends what waits first."""
        if isinstance(event, StageMark):
            response.on_stage(event.stage, event.t)
            return []
        if isinstance(event, TurnDone):
            for stage, t in event.stages.items():
                response.on_stage(stage, t)
        gate = self._gate
        if isinstance(event, TurnFailed | TurnCancelled):
            actions: list[Action] = []
            for waiting in gate.take_all():
                actions += self._apply(response, waiting, now)
            return actions + self._responses.on_engine_event(event, now) + self.announce(now)
        # Audio is resampled as it comes (in order, whatever waits), so that a paced piece is exactly what it adds.
        piece = response.frame_samples if self._config().output_lead_ms is not None else None
        if isinstance(event, AudioChunk):
            gate.put_audio(event.turn_id, response.resample(event.pcm), piece, whole=piece is None and event.backlog)
            return self.pump(now)
        if isinstance(event, TurnDone) and event.finish_reason is FinishReason.STOP:  # the resampler's tail plays too
            gate.put_audio(event.turn_id, response.resample_tail(), piece)
        gate.put(event)
        return self.pump(now)

    def _apply(self, response: ActiveResponse, waiting: Waiting, now: float) -> list[Action]:
        if isinstance(waiting, WireAudio):
            return [Send(e) for e in response.on_wire_audio(waiting.samples, now, whole=waiting.whole)]
        return self._responses.on_engine_event(waiting, now)

    def _due_at(self, response: ActiveResponse, waiting: Waiting) -> float | None:
        """When `waiting` may go out: None = now (not paced audio); else once the client's unplayed audio
        leaves room for it within `output_lead_ms`."""
        lead_ms = self._config().output_lead_ms
        clock = response.playback
        if lead_ms is None or clock is None or not isinstance(waiting, WireAudio) or not response.wire_rate_hz:
            return None
        piece_ms = 1000.0 * waiting.samples.size / response.wire_rate_hz
        return clock.end_at - max(0.0, lead_ms - piece_ms) / 1000.0

    def _must_wait(self, response: ActiveResponse, event: Waiting, now: float) -> bool:
        """Paced audio waits while the client holds audio and this piece would take it past the lead."""
        due = self._due_at(response, event)
        clock = response.playback
        return due is not None and clock is not None and due > now + _EPS_S and clock.lead_ms(now) > 0

    def pump(self, now: float) -> list[Action]:
        """Apply, in order, the waiting events that may go out at `now` (none while a hold lasts)."""
        gate = self._gate
        actions: list[Action] = []
        while (event := gate.peek()) is not None:
            response = self._responses.active
            if response is None or event.turn_id != response.id:
                gate.pop()  # its response has ended: it never goes out
                continue
            if gate.holds(event.turn_id) or self._must_wait(response, event, now):
                break
            gate.pop()
            actions += self._apply(response, event, now)
        return actions + self.announce(now)

    def release(self, now: float) -> list[Action]:
        """The server's drain deadline: everything the active response has waiting goes out now, unpaced and unheld
        (the client buffers it; the connection is about to close), so a reply the engine finished completes."""
        actions: list[Action] = []
        response = self._responses.active
        for waiting in self._gate.take_all():
            if response is not None and waiting.turn_id == response.id:
                actions += self._apply(response, waiting, now)
        return actions + self.announce(now)

    def sync(self, now: float) -> list[Action]:
        """After the input moved or time passed: start or end the hold, send what is due, tell the client what
        its playout does."""
        response = self._responses.active
        self._gate.sync(self._judging(), None if response is None else response.id, now, self._word_over(),
                        self._silent_since(response))
        return self.pump(now)

    def _silent_since(self, response: ActiveResponse | None) -> float | None:
        """When the listener ran out of the held response's audio (None: no audio was sent yet; it may still play)."""
        clock = None if response is None else response.playback
        return None if clock is None or clock.sent_ms <= 0 else clock.end_at

    def deadline(self) -> float | None:
        """Monotonic s at which the session must be woken (`Session.on_output_timer`) although no input came: the
        next paced piece is due, the hold expires or reaches its pause bound, or a finished reply plays out
        (`output_audio_buffer.stopped`)."""
        times: list[float] = []
        gate = self._gate
        event, response = gate.peek(), self._responses.active
        if gate.since is not None:
            times.append(gate.since + gate.max_hold_s)
            pause_end = gate.pause_ends_at(self._word_over(), self._silent_since(response))
            if pause_end is not None:
                times.append(pause_end)
        if event is not None and response is not None and not gate.holds(event.turn_id):
            due = self._due_at(response, event) if event.turn_id == response.id else None
            times.append(due if due is not None else 0.0)
        if self._tells():
            times += [c.end_at for c in self._playback.clocks if c.done and c.started_told and not c.end_told]
        return min(times) if times else None

    def _tells(self) -> bool:
        """The session sends `output_audio_buffer.*` itself: its client asked, and no transport plays the audio out
        (a WebRTC call's playout sends its own)."""
        return self._config().output_audio_buffer and not self.transport_playout

    def announce(self, now: float) -> list[Action]:
        """`output_audio_buffer.started` for each clock that began, `.stopped` for each done one that played out
        (where the session sends those events)."""
        if not self._tells():
            return []
        actions: list[Action] = []
        for clock in self._playback.clocks:
            if clock.sent_ms > 0 and not clock.started_told:
                clock.started_told = True
                actions.append(Send(OutputAudioBufferStarted(response_id=clock.response_id)))
            if clock.done and clock.started_told and not clock.end_told and clock.end_at <= now:
                clock.end_told = True
                actions.append(Send(OutputAudioBufferStopped(response_id=clock.response_id)))
        return actions

    # ---- the client stopped playing ---------------------------------------------------------------------------
    def interrupted(self, now: float, cancelled: str | None) -> list[Action]:
        """A real interruption (`speech_started`, interrupt_response on; response `cancelled` already cancelled):
        the client stops playing at once. Where the server tracks playout it truncates the item at the played
        position and says `output_audio_buffer.cleared`."""
        actions: list[Action] = []
        for clock in self._playback.clocks:
            if clock.playing(now) or (clock.response_id == cancelled and clock.sent_ms > 0):
                position = clock.stop(now)
                if self._tells():
                    actions += self._truncate(clock, position) + _cleared(clock)
        return actions

    def client_stopped(self, item_id: str, audio_end_ms: int, now: float) -> None:
        """The client truncated item `item_id` at `audio_end_ms`: it stopped playing there."""
        for clock in self._playback.clocks:
            if clock.item_id == item_id and not clock.stopped:
                clock.stop(now, audio_end_ms)

    def on_clear(self, event: ce.OutputAudioBufferClear, now: float) -> list[Action]:
        """Cut off the reply's audio: the active response is cancelled, what is still playing stops and its item is
        truncated at the played position (`conversation.item.truncated`), then `output_audio_buffer.cleared`."""
        latest = self._playback.latest
        if latest is None:
            return error_reply(ErrorCode.OUTPUT_AUDIO_BUFFER_EMPTY, event.event_id)
        actions: list[Action] = []
        if self._responses.active is not None:
            actions += self._responses.cancel(StatusReason.CLIENT_CANCELLED, now)
        for clock in self._playback.clocks:
            if clock.playing(now):
                actions += self._truncate(clock, clock.stop(now)) + (_cleared(clock) if clock is not latest else [])
        return actions + _cleared(latest, always=True)

    def _truncate(self, clock: PlaybackClock, position_ms: float) -> list[Action]:
        """Cut the clock's item at the played position (`conversation.item.truncated`), if any of it went unheard."""
        entry = self._conversation.get(clock.item_id)
        if not isinstance(entry, AssistantItem) or entry.codec is None or position_ms >= entry.audio_ms:
            return []
        audio_end_ms = int(position_ms)
        entry.truncate(audio_end_ms)
        return self._speculation.discard() + [
            Send(ConversationItemTruncated(item_id=entry.id, content_index=0, audio_end_ms=audio_end_ms))]


def _cleared(clock: PlaybackClock, always: bool = False) -> list[Action]:
    if clock.end_told and not always:
        return []
    clock.end_told = True
    return [Send(OutputAudioBufferCleared(response_id=clock.response_id))]
