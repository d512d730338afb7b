"""Admission: how a submitted turn reaches the thinker (the engine thread's half of `Engine.submit`).

`_admit` refuses what cannot run (a duplicate id, too many active turns, an unknown voice) and records the
turn; once its inputs are prepared (`_admit_prepared`, from its `InputsReady` or at once) it goes to the
thinker, except a side request (`prefix_from`, e.g. the transcription fork of a spoken turn) that waits in
`_forks` until the conversation whose prefix it reuses has prefilled. `_launch` completes the admissions whose
encoders finished. A failed admission fails that turn alone (`_admission_failed`): known refusals with their
code, anything else as ADMISSION_FAILED with its conversation's cache dropped.

`Admission` is a mixin of `Engine` (engine thread only): it uses the engine's turn table, runners and
delivery (`_turns`, `_parked`, `_forks`, `_thinker`, `_talker`, `_mark`, `_fail`, `_call_sink`, ...).
"""

from __future__ import annotations

from concurrent.futures import Future

from .api import EngineBusyError, FailureCode, Stage, TurnFailed, TurnRequest, TurnTask
from .commands import Sink
from .prompt_budget import ContextLengthExceeded
from .segmenter import Segmenter
from .supervision import InjectedEngineDeath, asks_for_engine_death
from .tool_calls import ToolCallParser, tool_names
from .turn_state import TurnState as _Turn

__all__ = ["Admission"]

# admission errors that are answers, not bugs: every slot busy; the conversation does not fit, even truncated as
# asked; content the model cannot take (too long, media it rejects)
_REFUSALS = ((EngineBusyError, FailureCode.ENGINE_BUSY), (ContextLengthExceeded, FailureCode.CONTEXT_LENGTH_EXCEEDED),
             (ValueError, FailureCode.INVALID_PROMPT))


class Admission:
    """The engine thread's admission of submitted turns (a mixin of `Engine`)."""

    def _admit(self, request: TurnRequest, sink: Sink, prepared: Future) -> None:
        refusal = None
        if request.turn_id in self._turns or request.turn_id in self._parked:
            refusal = FailureCode.ADMISSION_FAILED, "duplicate turn id"
        elif len(self._turns) >= self.cfg.max_queued_turns + self.cfg.thinker.max_batch:
            refusal = FailureCode.ENGINE_BUSY, "engine busy: too many active turns"
        elif request.task is TurnTask.JUDGE_TURN and self._thinker.judge_answers is None:
            refusal = FailureCode.TASK_UNAVAILABLE, ("turn judgement is off on this engine "
                                                     "(engine.thinker.turn_judgement: auto is on for checkpoint weights only)")
        # a turn judgement is never spoken, whatever the request says
        with_audio = request.with_audio and self._talker is not None and request.task is not TurnTask.JUDGE_TURN
        if (refusal is None and isinstance(request.voice, str) and with_audio
                and request.voice not in self.bundle.voices):
            refusal = FailureCode.INVALID_PROMPT, f"unknown voice {request.voice!r}"
        if refusal is not None:
            prepared.cancel()
            self._call_sink(sink, TurnFailed(request.turn_id, refusal[1], refusal[0]))
            return
        turn = _Turn(request, sink, [] if request.speculative else None,
                     Segmenter(self.cfg.segmenter) if with_audio else None)
        turn.t0_ms = self._now_ms()
        turn.prepared = prepared
        if request.task is TurnTask.REPLY:  # without tools too: a call the model makes up is never spoken
            turn.tool_parser = ToolCallParser(request.turn_id, tool_names(request.tools))
        self._turns[request.turn_id] = turn
        self._mark(turn, Stage.SUBMITTED)
        if self._fault_injection and asks_for_engine_death(request):
            raise InjectedEngineDeath(f"fault injection: turn {request.turn_id} asked for the engine's death")
        if prepared.done():  # else its InputsReady admits it
            self._admit_prepared(turn)

    def _admit_forks(self) -> None:
        """Admit the waiting side requests whose source conversation has prefilled its prompt (or stopped)."""
        waiting, self._forks = self._forks, []
        for turn in waiting:
            if self._turns.get(turn.request.turn_id) is turn and turn.prepared is not None:  # else gone or admitted
                self._admit_prepared(turn)

    def _admit_prepared(self, turn: _Turn) -> None:
        """Admit a turn whose inputs are prepared to the thinker (prefix matching; its tail's media go to the
        encoder worker, and `_launch` completes the admission), or fail it; a side request waits (`_forks`) while
        the turn whose prefix it reuses is still being prepared, encoded or prefilled."""
        source = turn.request.prefix_from
        if source is not None and (not self._thinker.fork_ready(turn.request) or any(
                t.prepared is not None and t.request.conversation_id == source for t in self._turns.values())):
            if turn not in self._forks:  # its source's turn is still being prepared or prefilled
                self._forks.append(turn)
            return
        request, prepared, turn.prepared = turn.request, turn.prepared, None
        try:  # a preparation error (a prompt over budget, media the model rejects) is raised here
            queued = self._thinker.admit(request, prepared.result())
        except Exception as exc:
            self._admission_failed(request, exc)
            return
        if queued:
            self._mark(turn, Stage.ENCODERS_DONE)

    def _admission_failed(self, request: TurnRequest, exc: Exception) -> None:
        """Fail a turn whose admission raised: a known refusal with its code (`_REFUSALS`); anything else is a
        bug this request reached: it fails alone (its cache invalidated), the engine goes on."""
        code = next((code for kind, code in _REFUSALS if isinstance(exc, kind)), None)
        if code is not None:
            self._fail(request.turn_id, str(exc), code)
            return
        self._faults.report(f"admission of turn {request.turn_id}", exc)
        self._fail(request.turn_id, f"admission failed: {type(exc).__name__}: {exc}", FailureCode.ADMISSION_FAILED)
        self._guarded("invalidating a failed turn's cache", self._thinker.close_conversation, request.conversation_id)

    def _launch(self):
        """Complete the admissions whose encoders finished, then queue the thinker's next step."""
        for turn_id, error in self._thinker.admitted():
            turn = self._turns.get(turn_id)
            if turn is not None and error is None:
                self._mark(turn, Stage.ENCODERS_DONE)
            elif turn is not None:
                self._admission_failed(turn.request, error)
        return self._thinker.launch()

