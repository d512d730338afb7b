"""The thinker's output processor: a sampled token becomes streamed text and maybe a finish.

Applies the row's forced tokens, eos, tool-call markers (a reply's `<tool_call>` / `</tool_call>` reach the text stream verbatim),
the length limits (max_tokens, the context) and stop strings (text that could still grow into a stop
string is held back until it cannot).
"""

from __future__ import annotations

from .api import FinishReason, TurnTask
from .forced import forced_token
from .scheduler import Row
from .tool_calls import CALL_CLOSE, CALL_OPEN

__all__ = ["OutputProcessor"]


class OutputProcessor:
    def __init__(self, tokenizer, max_seq_len: int):
        self.tok = tokenizer
        self.max_seq_len = max_seq_len
        # only the call markers reach the text (the reply's parser cuts calls out); a `<tool_response>` the model
        # writes is skipped like every other special token
        self._markers = {i: t for i, t in tokenizer.marker_ids().items() if t in (CALL_OPEN, CALL_CLOSE)}

    def accept(self, row: Row, token: int) -> tuple[str, FinishReason | None]:
        """Account a sampled token: -> (the text it releases, the finish reason if the row is done)."""
        sp = row.request.sampling
        finish = None
        token = forced_token(row.forced, row.generated, token)
        if token == self.tok.eos_id and not sp.ignore_eos:
            finish = FinishReason.STOP
        else:
            row.generated.append(token)
            # a reply's tool markers reach the text (its parser drops a call to a function it does not offer);
            # a transcription skips them like every special token
            marker = self._markers.get(token) if row.request.task is TurnTask.REPLY else None
            row.text += row.decoder.push(token) if marker is None else row.decoder.flush() + marker
            if len(row.generated) >= sp.max_tokens or len(row.slot.ids) + 1 >= self.max_seq_len:
                finish = FinishReason.LENGTH
        if finish is not None:
            row.text += row.decoder.flush()
        cut = stop_cut(row.text, sp.stop)
        if cut is not None:
            row.text, finish = row.text[:cut], FinishReason.STOP
        safe = len(row.text) if finish is not None else len(row.text) - stop_holdback(row.text, sp.stop)
        delta = row.text[row.emitted:safe]
        row.emitted = max(row.emitted, safe)
        if finish is None:
            row.next_token = token
        return delta, finish


def stop_cut(text: str, stops) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def stop_holdback(text: str, stops) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best
