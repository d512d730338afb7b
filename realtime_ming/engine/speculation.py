"""Bounded speculation: what an unconfirmed speculative turn may consume, and how its held output is released.

A speculative turn (`TurnRequest.speculative`, submitted at the user's first short pause) runs normally but its
events are held (`TurnState.held`) until the session confirms it (end of the user's turn) or discards it (the user
spoke on). A turn decision can wait seconds (semantic_vad's silence fallback: 2 / 4 / 8 s); unbounded, a fast
engine would meanwhile speak tens of seconds of a reply that may be thrown away (GPU time every other session
needs) and hand them all to the session at once on confirm.

The bound (`Speculation.bound`, after every engine step): an unconfirmed turn

* pauses its thinker row and its talker stream once it holds `engine.speculation_lookahead_ms` of audio: its first
  audio is ready, so a confirmed turn's TTFA waits for nothing, and the listener has that much to play while the
  turn resumes in the next engine step (at any RTF below 1 it stays ahead of playback);
* pauses its thinker row once it has generated `engine.speculation_lookahead_tokens` tokens, a spoken turn only
  once its first segment went to the talker (which then speaks on from the text it has): the bound of a turn
  without audio, and of a spoken turn whose talker is slow to reach its lookahead. A spoken turn whose text has
  not yet made a segment keeps its thinker (its first audio needs that text).

A paused thinker row keeps its KV slot, position, next token and sampler and leaves the decode batch
(`Scheduler.pause`); a paused talker stream is parked with its row state and noise generator
(`TalkerRunner.pause`). A paused-then-confirmed turn's text and audio are therefore exactly a never-paused run's.
`confirm` resumes both in the next engine step; `discard` frees them as before. While unconfirmed a turn holds at
most about lookahead_tokens text deltas, lookahead_ms / 320 ms + 2 audio chunks and a few stage marks, however
long the decision takes; `None` for both settings restores the unbounded behaviour.

The release (`Speculation.deliver_held`) coalesces the held events (`coalesce`): within each run of text, audio and
stage marks (a tool-call event, a judgement or the terminal event ends a run) the text deltas become one delta and
the audio chunks of each segment one chunk marked `AudioChunk.backlog`, which the session sends as one audio delta
instead of cutting it into `output_frame_ms` frames. A confirmed turn thus reaches the client as a handful of
events, never a burst that trips the connection's outbound cap (1,024 frames), and the client still receives exactly
the same transcript and PCM. The transcript and the audio are separate streams of one content part, so sending a
run's transcript before its audio changes no order the protocol defines.

`Speculation` is given the engine's turn table (`engine/turn_table.py`), thinker and talker; engine thread only, except
`deliver_held` (under the table's lock).
"""

from __future__ import annotations

import numpy as np

from .api import (
    OUTPUT_SAMPLE_RATE_HZ,
    AudioChunk,
    Stage,
    StageMark,
    TextDelta,
    TurnEvent,
)
from .config import EngineConfig
from .talker_driver import TalkerDriver
from .thinker_runner import ThinkerRunner
from .turn_state import TurnState
from .turn_table import TurnTable

__all__ = ["Speculation", "coalesce"]


def coalesce(events: list[TurnEvent]) -> list[TurnEvent]:
    """Held events as few events: per run of text / audio / stage marks, the marks (in order), one text delta, then
    one backlog audio chunk per segment (PCM concatenated in order); any other event ends a run and keeps its place."""
    out: list[TurnEvent] = []
    marks: list[StageMark] = []
    text: list[TextDelta] = []
    audio: dict[tuple[int, int], list[AudioChunk]] = {}  # (segment, rate) -> chunks, in order of first chunk

    def flush() -> None:
        out.extend(marks)
        if text:
            out.append(TextDelta(text[0].turn_id, "".join(e.text for e in text)))
        for chunks in audio.values():
            first = chunks[0]
            pcm = np.concatenate([c.pcm for c in chunks]) if len(chunks) > 1 else first.pcm
            out.append(AudioChunk(first.turn_id, pcm, first.sample_rate_hz, first.segment_id, backlog=True))
        marks.clear()
        text.clear()
        audio.clear()

    for event in events:
        if isinstance(event, StageMark):
            marks.append(event)
        elif isinstance(event, TextDelta):
            text.append(event)
        elif isinstance(event, AudioChunk):
            audio.setdefault((event.segment_id, event.sample_rate_hz), []).append(event)
        else:
            flush()
            out.append(event)
    flush()
    return out


class Speculation:
    """The engine thread's handling of speculative turns."""

    def __init__(self, cfg: EngineConfig, table: TurnTable, thinker: ThinkerRunner, talker: TalkerDriver | None):
        self.cfg, self.table, self.thinker, self.talker = cfg, table, thinker, talker

    def bound(self) -> None:
        """Pause the unconfirmed turns that hold what the user needs at confirmation (module docstring)."""
        lookahead_ms, lookahead_tokens = self.cfg.speculation_lookahead_ms, self.cfg.speculation_lookahead_tokens
        for turn_id, turn in self.table.turns.items():
            if turn.held is None or (turn.thinker_paused and turn.talker_paused):
                continue
            audio = (lookahead_ms is not None and turn.audio_samples > 0
                     and turn.audio_samples * 1000.0 >= lookahead_ms * OUTPUT_SAMPLE_RATE_HZ)
            tokens = (lookahead_tokens is not None and self.thinker.generated(turn_id) >= lookahead_tokens
                      and (turn.segmenter is None or Stage.FIRST_SEGMENT in turn.stages))
            if (audio or tokens) and not turn.thinker_paused:
                turn.thinker_paused = True
                self.thinker.pause(turn_id)
            if audio and not turn.talker_paused:
                turn.talker_paused = True
                self.talker.pause(turn_id)

    def confirm(self, turn_id: str) -> None:
        """Release a speculative turn's held output (coalesced) and let it run on from the next engine step."""
        parked = self.table.parked.pop(turn_id, None)
        if parked is not None:  # it ended while unconfirmed: everything, its terminal event included, goes now
            self.deliver_held(parked)
            return
        turn = self.table.turns.get(turn_id)
        if turn is None or turn.held is None:
            return
        self._resume(turn_id, turn)
        self.deliver_held(turn)
        self.table.mark(turn, Stage.CONFIRMED)

    def discard(self, turn_id: str) -> None:
        """Drop a speculative turn silently and free its rows (paused or not)."""
        self.table.parked.pop(turn_id, None)
        turn = self.table.turns.pop(turn_id, None)
        if turn is not None:
            turn.ended = True
            self.table.release(turn_id)

    def _resume(self, turn_id: str, turn: TurnState) -> None:
        if turn.thinker_paused:
            turn.thinker_paused = False
            self.thinker.resume(turn_id)
        if turn.talker_paused:
            turn.talker_paused = False
            self.talker.resume(turn_id)

    def deliver_held(self, turn: TurnState) -> None:
        """Hand a turn's held events to its sink, coalesced; from now on its events go straight to the sink."""
        with self.table.lock:
            held, turn.held = turn.held, None
            for event in coalesce(held or []):
                self.table.call_sink(turn.sink, event)

    def held_stats(self) -> tuple[int, int]:
        """(events held by unconfirmed turns, parked ones included; unconfirmed turns that consume nothing now: thinker
        paused, and talker paused or done with the text it had)."""
        live = {i: t for i, t in self.table.turns.items() if t.held is not None}
        held = sum(len(t.held) for t in live.values()) + sum(len(t.held) for t in self.table.parked.values())
        frozen = sum(1 for i, t in live.items() if t.thinker_paused and (
            t.talker_paused or self.talker is None or not self.talker.pending(i)))
        return held, frozen
