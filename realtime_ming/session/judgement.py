"""The thinker's judgement of the user's words at a pause (semantic_vad): the session's side of `JUDGE_TURN`.

When semantic_vad submits the speculative reply at a pause and the engine offers turn judgement
(`engine_supports(engine, TurnTask.JUDGE_TURN)`, told by the runner), the session also submits one side turn that
asks the thinker whether the user has finished (`engine/turn_judgement.py`: the question after the user's audio,
forked from the reply's prefilled K/V; it queues behind every reply's prefill). Its `TurnJudgement` goes to
`InputTurns.on_judgement`, which combines it with Smart Turn's prosody at the decision point. Nothing of it
reaches the wire: its events never leave this module and `InputTurns`, a failed or cancelled judgement means
prosody decides alone, and a pause that ends (speech resumed, turn ended) cancels its judgement.

The judgements have their own KV slot (`<conversation>_eot`, freed after each), so they never evict the
conversation's cached prefix.
"""

from __future__ import annotations

from typing import Final

from ..engine.api import (
    SamplingParams,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnJudgement,
    TurnRequest,
    TurnTask,
    judgement_history,
)
from ..protocol.ids import IdPrefix, new_id
from .actions import Action, CancelTurn, CloseConversation, SubmitTurn

__all__ = ["NO_ANSWER", "TurnJudge"]

NO_ANSWER: Final = object()  # an engine event of a judgement that carries no answer (a stage mark, its TurnDone)


class TurnJudge:
    """The words-judgement side turns of one session: build and submit, route engine events, cancel, free."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id + "_eot"
        self.available = False  # the engine runs JUDGE_TURN (set by the runner)
        self._running: set[str] = set()
        self._used = False

    def new_turn_id(self) -> str:
        return new_id(IdPrefix.RESPONSE)

    def submit(self, turn_id: str, reply: TurnRequest) -> list[Action]:
        """Judge the words `reply` (the speculative reply, ending with the user's audio) answers."""
        request = TurnRequest(turn_id=turn_id, conversation_id=self.conversation_id,
                              history=judgement_history(reply.history), system=reply.system, tools=reply.tools,
                              truncation=reply.truncation, with_audio=False, task=TurnTask.JUDGE_TURN,
                              sampling=SamplingParams(temperature=0.0, max_tokens=1),
                              prefix_from=reply.conversation_id)
        self._running.add(turn_id)
        self._used = True
        return [SubmitTurn(request)]

    def owns(self, turn_id: str) -> bool:
        return turn_id in self._running

    def on_engine_event(self, event: TurnEvent) -> tuple[object, list[Action]]:
        """(P(complete), None when the judgement ended without one, or NO_ANSWER; actions) of one engine event."""
        if isinstance(event, TurnJudgement):
            return event.p_complete, []
        if isinstance(event, TurnDone | TurnCancelled | TurnFailed):
            self._running.discard(event.turn_id)
            answer = NO_ANSWER if isinstance(event, TurnDone) else None
            return answer, [CloseConversation(self.conversation_id)]
        return NO_ANSWER, []  # a stage mark (a judgement has no text, audio or calls)

    def cancel_all(self) -> list[Action]:
        """The pause they judged is over: stop the judgements still running (their TurnCancelled frees the slot)."""
        return [CancelTurn(t) for t in sorted(self._running)]

    def close(self) -> list[Action]:
        """Session end: cancel every running judgement and free the slot."""
        actions = self.cancel_all()
        self._running.clear()
        if self._used:
            actions.append(CloseConversation(self.conversation_id))
        return actions
