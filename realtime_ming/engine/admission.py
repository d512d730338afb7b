"""Admission: how a submitted turn reaches the thinker (the engine thread's half of `Engine.submit`).

`admit` refuses what cannot run (a duplicate id, too many active turns, an unknown voice) and records the
turn in the turn table; once its inputs are prepared (`admit_prepared`, from its `InputsReady` or at once) it goes
to the thinker, except a side request (`prefix_from`, e.g. the transcription fork of a spoken turn) that waits in
`forks` until the conversation whose prefix it reuses has prefilled. `launch` completes the admissions whose
encoders finished. A failed admission fails that turn alone (`_failed`): known refusals with their code, anything
else as ADMISSION_FAILED with its conversation's cache dropped.

`Admission` is given the engine's turn table (`engine/turn_table.py`) and thinker; engine thread only.
"""

from __future__ import annotations

from concurrent.futures import Future

from .api import EngineBusyError, FailureCode, Stage, TurnFailed, TurnRequest, TurnTask
from .commands import Sink
from .config import EngineConfig
from .prompt_budget import ContextLengthExceeded
from .segmenter import Segmenter
from .supervision import InjectedEngineDeath, asks_for_engine_death
from .tool_calls import ToolCallParser, tool_names
from .thinker_runner import ThinkerRunner
from .turn_state import TurnState
from .turn_table import TurnTable

MAX_QUEUED_TURNS = 64  # turns submitted beyond a full decode batch (max_batch); more: TurnFailed("engine busy")

__all__ = ["Admission"]

# admission errors that are answers, not bugs: every slot busy; the conversation does not fit, even truncated as
# asked; content the model cannot take (too long, media it rejects)
_REFUSALS = ((EngineBusyError, FailureCode.ENGINE_BUSY), (ContextLengthExceeded, FailureCode.CONTEXT_LENGTH_EXCEEDED),
             (ValueError, FailureCode.INVALID_PROMPT))


class Admission:
    """The engine thread's admission of submitted turns."""

    def __init__(self, cfg: EngineConfig, table: TurnTable, thinker: ThinkerRunner, voices, has_talker: bool,
                 fault_injection: bool = False):
        self.cfg, self.table, self.thinker = cfg, table, thinker
        self.voices = voices  # the preset voices' names
        self.has_talker = has_talker
        self.fault_injection = fault_injection  # a turn carrying the kill marker kills the engine thread
        self.forks: list[TurnState] = []  # prepared side requests waiting for their source's prefill (`fork_ready`)

    def admit(self, request: TurnRequest, sink: Sink, prepared: Future, now_ms: float) -> None:
        table = self.table
        refusal = None
        if request.turn_id in table.turns or request.turn_id in table.parked:
            refusal = FailureCode.ADMISSION_FAILED, "duplicate turn id"
        elif len(table.turns) >= MAX_QUEUED_TURNS + self.cfg.thinker.max_batch:
            refusal = FailureCode.ENGINE_BUSY, "engine busy: too many active turns"
        elif request.task is TurnTask.JUDGE_TURN and self.thinker.judge_answers is None:
            refusal = FailureCode.TASK_UNAVAILABLE, ("turn judgement is off on this engine "
                                                     "(engine.thinker.turn_judgement: auto is on for checkpoint weights only)")
        # a turn judgement is never spoken, whatever the request says
        with_audio = request.with_audio and self.has_talker and request.task is not TurnTask.JUDGE_TURN
        if (refusal is None and isinstance(request.voice, str) and with_audio
                and request.voice not in self.voices):
            refusal = FailureCode.INVALID_PROMPT, f"unknown voice {request.voice!r}"
        if refusal is not None:
            prepared.cancel()
            table.call_sink(sink, TurnFailed(request.turn_id, refusal[1], refusal[0]))
            return
        turn = TurnState(request, sink, [] if request.speculative else None,
                         Segmenter(self.cfg.segmenter) if with_audio else None)
        turn.t0_ms = now_ms
        turn.prepared = prepared
        if request.task is TurnTask.REPLY:  # without tools too: a call the model makes up is never spoken
            turn.tool_parser = ToolCallParser(request.turn_id, tool_names(request.tools))
        table.turns[request.turn_id] = turn
        table.mark(turn, Stage.SUBMITTED)
        if self.fault_injection and asks_for_engine_death(request):
            raise InjectedEngineDeath(f"fault injection: turn {request.turn_id} asked for the engine's death")
        if prepared.done():  # else its InputsReady admits it
            self.admit_prepared(turn)

    def admit_forks(self) -> None:
        """Admit the waiting side requests whose source conversation has prefilled its prompt (or stopped)."""
        waiting, self.forks = self.forks, []
        for turn in waiting:
            if self.table.turns.get(turn.request.turn_id) is turn and turn.prepared is not None:
                self.admit_prepared(turn)  # else gone, or admitted already

    def admit_prepared(self, turn: TurnState) -> None:
        """Admit a turn whose inputs are prepared to the thinker (prefix matching; its tail's media go to the
        encoder worker, and `launch` completes the admission), or fail it; a side request waits (`forks`) while
        the turn whose prefix it reuses is still being prepared, encoded or prefilled."""
        source = turn.request.prefix_from
        if source is not None and (not self.thinker.fork_ready(turn.request) or any(
                t.prepared is not None and t.request.conversation_id == source for t in self.table.turns.values())):
            if turn not in self.forks:  # its source's turn is still being prepared or prefilled
                self.forks.append(turn)
            return
        request, prepared, turn.prepared = turn.request, turn.prepared, None
        try:  # a preparation error (a prompt over budget, media the model rejects) is raised here
            queued = self.thinker.admit(request, prepared.result())
        except Exception as exc:
            self._failed(request, exc)
            return
        if queued:
            self.table.mark(turn, Stage.ENCODERS_DONE)

    def _failed(self, request: TurnRequest, exc: Exception) -> None:
        """Fail a turn whose admission raised: a known refusal with its code (`_REFUSALS`); anything else is a
        bug this request reached: it fails alone (its cache invalidated), the engine goes on."""
        code = next((code for kind, code in _REFUSALS if isinstance(exc, kind)), None)
        if code is not None:
            self.table.fail(request.turn_id, str(exc), code)
            return
        self.table.faults.report(f"admission of turn {request.turn_id}", exc)
        self.table.fail(request.turn_id, f"admission failed: {type(exc).__name__}: {exc}", FailureCode.ADMISSION_FAILED)
        self.table.guarded("invalidating a failed turn's cache", self.thinker.close_conversation,
                           request.conversation_id)

    def launch(self):
        """Complete the admissions whose encoders finished, then queue the thinker's next step."""
        for turn_id, error in self.thinker.admitted():
            turn = self.table.turns.get(turn_id)
            if turn is not None and error is None:
                self.table.mark(turn, Stage.ENCODERS_DONE)
            elif turn is not None:
                self._failed(turn.request, error)
        return self.thinker.launch()
