"""Routing each engine step's outputs to the turns: thinker text to the client, the tool-call parser and the
segmenter, segments to the talker, talker PCM to the client, finished turns to their end.

`Router` is given the engine's turn table (`engine/turn_table.py`) and talker. The engine thread calls it once per
step (`thinker_outputs`, `tick`, `talker_outputs`, `finish_done`); `deliver` also runs on a process talker's reader
thread (`engine/talker_process.py`), its events ordered by the table's lock.
"""

from __future__ import annotations

import time

from .api import AudioChunk, FailureCode, Stage, TextDelta, TurnJudgement
from .talker_driver import Enqueue, TalkerDriver
from .talker_runner import TalkerOutput
from .turn_state import TurnState
from .turn_table import TurnTable

__all__ = ["Router", "now_ms"]


def now_ms() -> float:
    return time.monotonic() * 1000.0


class Router:
    """What each engine step's outputs mean for their turns."""

    def __init__(self, table: TurnTable, talker: TalkerDriver | None):
        self.table, self.talker = table, talker

    def thinker_outputs(self, outputs: list) -> None:
        """A collected thinker step: prefill and first-token marks, text, judgements, finished replies."""
        table = self.table
        for out in outputs:
            turn = table.turns.get(out.turn_id)
            if turn is None:
                continue
            if out.prefill_done:
                turn.usage = (out.prompt_tokens, out.cached_tokens, 0)
                turn.by_modality = (out.prompt, out.cached)
                table.mark(turn, Stage.PREFILL_DONE)
            if out.text:
                if Stage.FIRST_TOKEN not in turn.stages:
                    table.mark(turn, Stage.FIRST_TOKEN)
                self._route_text(turn, turn.tool_parser.feed(out.text) if turn.tool_parser else [out.text])
            if out.p_complete is not None:
                table.emit(turn, TurnJudgement(out.turn_id, out.p_complete))
            if out.finish is not None:
                if turn.tool_parser is not None:
                    self._route_text(turn, turn.tool_parser.finish())
                turn.thinker_done = True
                turn.finish = out.finish
                turn.usage = (turn.usage[0], turn.usage[1], out.output_tokens)
                table.mark(turn, Stage.THINKER_DONE)
                if turn.segmenter is not None:
                    self._route_segments(turn, turn.segmenter.finish(now_ms()))

    def tick(self) -> None:
        """Segments whose wait ran out (the segmenter's deadlines) go to the talker."""
        now = now_ms()
        for turn in list(self.table.turns.values()):
            if turn.segmenter is not None and not turn.thinker_done:
                self._route_segments(turn, turn.segmenter.tick(now))

    def talker_outputs(self, outputs: list[TalkerOutput]) -> None:
        """The talker's outputs for the engine thread: failed turns end, the rest is delivered."""
        for out in outputs:
            if out.error is not None:
                self.table.fail(out.turn_id, out.error, FailureCode.ENGINE_ERROR)
        self.deliver([out for out in outputs if out.error is None])

    def finish_done(self) -> None:
        """End the turns whose thinker is done and whose talker has nothing left for them."""
        for turn_id, turn in list(self.table.turns.items()):
            if turn.thinker_done and (self.talker is None or not self.talker.pending(turn_id)):
                self.table.finish(turn_id, turn)

    def deliver(self, outputs: list[TalkerOutput]) -> None:
        """Talker outputs to their turns: stage marks, step counts, PCM (the engine thread, or a talker's reader)."""
        table = self.table
        for out in outputs:
            turn = table.turns.get(out.turn_id)
            if turn is None:
                continue
            if out.first_step and Stage.FIRST_TALKER_STEP not in turn.stages:
                table.mark(turn, Stage.FIRST_TALKER_STEP)
            if out.pcm is not None:  # talker steps of this turn (their PCM may be held back as silence)
                turn.talker_steps += out.steps
            if out.pcm is not None and out.pcm.size:
                if Stage.FIRST_PCM not in turn.stages:
                    table.mark(turn, Stage.FIRST_PCM)
                turn.audio_samples += int(out.pcm.size)
                table.emit(turn, AudioChunk(turn.request.turn_id, out.pcm, segment_id=out.segment_id))

    def _route_segments(self, turn: TurnState, segments) -> None:
        for seg in segments:
            if Stage.FIRST_SEGMENT not in turn.stages:
                self.table.mark(turn, Stage.FIRST_SEGMENT)
            self.talker.enqueue(Enqueue(turn.request.turn_id, seg.segment_id, seg.text, turn.request.voice,
                                        turn.request.sampling.seed, turn.request.caption))

    def _route_text(self, turn: TurnState, pieces: list) -> None:
        """Spoken text to the client and the segmenter; function-call events to the client only."""
        for piece in pieces:
            if not isinstance(piece, str):
                self.table.emit(turn, piece)
            elif piece:
                turn.text += piece
                self.table.emit(turn, TextDelta(turn.request.turn_id, piece))
                if turn.segmenter is not None:
                    self._route_segments(turn, turn.segmenter.push(piece, now_ms()))
