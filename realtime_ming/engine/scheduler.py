"""The thinker's scheduler: which rows run in the next step.

A row is one admitted turn on its KV slot. Admitted rows wait in the prefill queue until their prompt
tail has been prefilled (in chunks, several prompts packed into one padded batch), then decode one
token per step, all generating rows in one batch. Priority for first tokens: replies prefill in
arrival order, a side request (a turn judgement, then a transcription) waits behind every reply queued at its
admission, so it never delays a reply's first token by more than the decode row (or the one short prefill
chunk, for a judgement) it adds.

Long prompts share the prefill with the prompts queued behind them: a prompt that took a chunk and is not
complete goes back in the queue behind the prompts of its class waiting there (round robin, one chunk each), so
a short prompt waits at most one chunk of a long one (a 2048 x 2048 image is ~4,000 prompt tokens, 16 chunks of
256: seconds on a CPU) instead of all of it, and other sessions' first tokens keep coming. Beside decoding rows a
prompt that has had a chunk may be held for a step (`prefill_pace.PrefillPace.holds`: a long prompt takes at most
half the host's time while others stream); prompts not started yet still prefill then (`fresh_only`).

A prefill chunk reads every MoE expert once more than the decode step beside it (~15 ms more at the full shapes
on a GPU), whatever its size: every step with a queued prompt runs one chunk, packing what is queued.

A row can be paused (`pause`: an unconfirmed speculative turn that holds enough output, `engine/speculation.py`):
it keeps its slot, its position and its next token but leaves the decode batch until `resume`; its prefill, if
any is left, still runs (a first token is what a speculative turn is for).

Engine thread only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from .api import PromptTokens, TurnRequest, TurnTask
from .forced import Forced
from .kv_slots import KVSlot

__all__ = ["Row", "Scheduler"]

# prefill order of rows not started yet: replies (a first audio waits), then turn judgements (a turn-end decision
# waits), then transcriptions
_PRIORITY = {TurnTask.REPLY: 0, TurnTask.JUDGE_TURN: 1, TurnTask.TRANSCRIBE: 2}


@dataclass
class Row:
    request: TurnRequest
    slot: KVSlot
    prefill: object  # multimodal.PrefillInputs of the tail still to run
    tail_ids: list
    offset: int
    rope_delta: int
    prompt_tokens: int
    cached_tokens: int
    decoder: object
    generator: torch.Generator | None
    usage: tuple[PromptTokens, PromptTokens] | None = None  # (prompt, cached) by modality
    generated: list = field(default_factory=list)
    next_token: int | None = None
    text: str = ""
    emitted: int = 0  # characters of `text` already handed out (stop-string hold-back)
    forced: Forced | None = None  # tokens this row must emit (forced prefix / forced reply)
    judgement: torch.Tensor | None = None  # a JUDGE_TURN row's P(complete) (device scalar), once prefilled


class Scheduler:
    """Admission queue, prefill packing and the decode batch of the thinker's rows."""

    def __init__(self, max_batch: int, prefill_chunk_tokens: int):
        self.max_batch = max_batch
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.rows: dict[str, Row] = {}
        self.prefill_queue: deque[str] = deque()
        self.paused: set[str] = set()  # rows out of the decode batch until resumed

    def has_work(self) -> bool:
        """Whether a step has anything to run (paused rows decode nothing)."""
        return bool(self.prefill_queue) or any(t not in self.paused for t in self.rows)

    def pause(self, turn_id: str) -> None:
        if turn_id in self.rows:
            self.paused.add(turn_id)

    def resume(self, turn_id: str) -> None:
        self.paused.discard(turn_id)

    def add(self, row: Row) -> None:
        """Admit a row: it waits for its prefill (replies before side requests not yet started; a turn judgement,
        which a turn-end decision waits for, before a transcription not yet started)."""
        self.rows[row.request.turn_id] = row
        self._enqueue(row)

    def _enqueue(self, row: Row) -> None:
        """Queue `row`'s prefill behind the rows of its class or a better one, and before the lower classes'
        rows not started yet."""
        queue, rank = self.prefill_queue, _PRIORITY[row.request.task]
        later = next((i for i, t in enumerate(queue) if _PRIORITY[self.rows[t].request.task] > rank
                      and self.rows[t].offset == 0), None)
        if later is None:
            queue.append(row.request.turn_id)
        else:
            queue.insert(later, row.request.turn_id)

    def prefilling(self, conversation_id: str) -> bool:
        """Whether a turn of `conversation_id` still has prompt tokens to prefill (a fork of it would miss them)."""
        return any(self.rows[t].slot.conversation_id == conversation_id for t in self.prefill_queue)

    def remove(self, turn_id: str) -> Row | None:
        """Drop a row (finished or cancelled) and free its slot for the next turn."""
        row = self.rows.pop(turn_id, None)
        self.paused.discard(turn_id)
        if row is not None:
            row.slot.busy = None
            if turn_id in self.prefill_queue:
                self.prefill_queue.remove(turn_id)
        return row

    def is_live(self, row: Row) -> bool:
        """Whether `row` is still scheduled (not cancelled while a step it was in was in flight)."""
        return self.rows.get(row.request.turn_id) is row

    def decoding(self) -> list[Row]:
        """The rows generating and not paused: each runs one decode step now."""
        return [r for t, r in self.rows.items() if r.next_token is not None and t not in self.paused]

    def waiting(self, fresh_only: bool = False) -> bool:
        """Whether a prompt waits for a chunk (`fresh_only`: a prompt that has had none yet)."""
        return bool(self._queued(fresh_only))

    def _queued(self, fresh_only: bool) -> list[Row]:
        rows = (self.rows[t] for t in self.prefill_queue)
        return [r for r in rows if r.offset == 0] if fresh_only else list(rows)

    def prefill_batch(self, fits: Callable[[int, int], bool] | None = None,
                      budget: int | None = None, fresh_only: bool = False) -> list[tuple[Row, int, int]]:
        """(row, start, end) chunks for this step: queue order, padded width x rows <= `budget` (default
        prefill_chunk_tokens; `prefill_pace.PrefillPace` cuts it beside decoding rows), and
        never grown from a shape a prefill graph serves (`fits(width, rows)`) into one none does (14 rows of 35
        tokens would pad to 16 x 64, past the budget: eager, ~2,500 launches; 8 rows now and 6 next step are
        two graph replays). `fresh_only`: only prompts that have had no chunk yet (a long one is held,
        `PrefillPace.holds`)."""
        budget, width, chosen = budget or self.prefill_chunk_tokens, 0, []
        for row in self._queued(fresh_only):
            take = min(len(row.tail_ids) - row.offset, budget)
            wider, rows = max(width, take), len(chosen) + 1
            if chosen and (wider * rows > budget or rows > self.max_batch
                           or fits is not None and fits(width, rows - 1) and not fits(wider, rows)):
                break
            chosen.append((row, row.offset, row.offset + take))
            width = wider
        return chosen

    def prefill_packed(self, budget: int, max_rows: int, fresh_only: bool = False) -> list[tuple[Row, int, int]]:
        """(row, start, end) chunks packed token after token (no padding: a mixed step, `thinker_mixed`): queue
        order, at most `budget` tokens and `max_rows` rows in all; [] when neither allows one token.
        `fresh_only` as in `prefill_batch`."""
        chosen = []
        for row in self._queued(fresh_only):
            if budget <= 0 or len(chosen) >= max_rows:
                break
            take = min(len(row.tail_ids) - row.offset, budget)
            chosen.append((row, row.offset, row.offset + take))
            budget -= take
        return chosen

    def prefilled(self, chosen: list[tuple[Row, int, int]]) -> list[Row]:
        """Account a prefill chunk that ran: the slots hold its tokens. -> the rows whose prompt is complete
        (out of the queue, ready to decode once their first token is sampled). A row with more to prefill goes
        back behind the rows of its class queued meanwhile (round robin)."""
        done = []
        for row, start, end in chosen:
            row.slot.ids.extend(row.tail_ids[start:end])
            row.offset = end
            self.prefill_queue.remove(row.request.turn_id)
            if end == len(row.tail_ids):
                done.append(row)
                row.prefill = None
            else:
                self._enqueue(row)
        return done
