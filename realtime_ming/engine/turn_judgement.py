"""The thinker's judgement of whether the user finished their turn (`TurnTask.JUDGE_TURN`): prompt and answers.

semantic_vad asks Smart Turn (prosody only) at a short silence; on a real checkpoint it also asks the thinker,
which reads the words. The question follows the user's audio in that same HUMAN turn, so everything up to the end
of the audio is token for token the speculative reply's prompt and the side request (`TurnRequest.prefix_from`)
starts from a copy of the K/V the reply already prefilled (`KVSlotManager.fork`), prefilling only the question::

    …<role>HUMAN</role><audio>…</audio>{TURN_QUESTION}<|role_end|><role>ASSISTANT</role>

Nothing is sampled: the answer is the softmax of the next-token logits of the two answers' first tokens ("Yes" =
the turn is complete), read from the checkpoint's own tokenizer (`answer_ids`; never fixed ids).

`engine.thinker.turn_judgement`: "auto" (default) is on only for real checkpoint weights (`model_path` with
`weights: checkpoint`); the embedded tiny model and dummy weights judge noise, so they run on prosody and the
silence fallback alone unless a test or benchmark turns it on. The `forced_turn_judgement` hook (tests, benchmarks:
`engine/hooks.py`) replaces the computed probability; the prefill still runs.
"""

from __future__ import annotations

from typing import Final

from .api import TURN_QUESTION, judgement_history
from .config import EngineConfig

__all__ = ["ANSWER_COMPLETE", "ANSWER_INCOMPLETE", "TURN_QUESTION", "answer_ids", "judgement_history",
           "turn_judgement_on"]

# the question and the history it follows are the engine API's (`api.judgement_history`): a session builds them
ANSWER_COMPLETE: Final = "Yes"
ANSWER_INCOMPLETE: Final = "No"


def answer_ids(tokenizer) -> tuple[int, int]:
    """(complete, incomplete): the first token id of each answer in `tokenizer` (a `ThinkerTokenizer`). A BPE
    vocabulary has each as one token; a byte-level one (the tiny model) reads their first letters. Raises
    ValueError when the two cannot be told apart."""
    yes, no = tokenizer.encode(ANSWER_COMPLETE), tokenizer.encode(ANSWER_INCOMPLETE)
    if not yes or not no or yes[0] == no[0]:
        raise ValueError(f"the tokenizer cannot tell the answers {ANSWER_COMPLETE!r} and {ANSWER_INCOMPLETE!r} "
                         f"apart by their first token ({yes[:1]} vs {no[:1]})")
    return yes[0], no[0]


def turn_judgement_on(cfg: EngineConfig) -> bool:
    """Whether the engine runs `JUDGE_TURN` turns (`engine.thinker.turn_judgement`, "auto" resolved)."""
    mode = cfg.thinker.turn_judgement
    if mode == "auto":
        return cfg.model_path is not None and cfg.weights == "checkpoint"
    return mode == "on"
