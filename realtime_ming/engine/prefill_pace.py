"""How large a prefill chunk may be, and when a long prompt's next chunk runs beside decoding rows: every decoding
row's next token, and every prompt queued behind, waits for a chunk.

`PrefillPace` keeps the host seconds per (padded) chunk token of the recent chunks, an exponential average that
follows the cost as a long prompt's context grows, and cuts a chunk to what fits `engine.thinker.prefill_step_ms`.
Where the host only launches the work (CUDA), a chunk costs it microseconds and the cut never binds; where it
computes the chunk itself (CPU) a 256-token chunk deep into a 4,000-token image prompt takes ~0.5 s or more, and
every other session's stream, and the next prompt of a session whose reply just ended (no row decodes at that
moment), would stall that long per chunk. Chunk after chunk a prompt runs at the same speed in smaller pieces.

A long prompt takes at most half of the host's time while other rows decode (`holds`): after a chunk that took
the host c seconds, the decoding rows get decode-only steps until c seconds have passed, then the prompt's next
chunk runs. Each step with a chunk is one decode token late for every streaming row; without the hold a 4,000-token
image prompt made every step such a step for seconds on a CPU (its tokens, and so a streaming row's events, came
at the pace of the chunks; issue 43, finding 9); with it the streams keep at least half their pace and the image's
prompt takes at most twice as long. A prompt's first chunk never waits (a new turn's first token is what the
hold protects too), nor does a prompt when no row decodes. On CUDA a chunk costs the host its launches, which the
step's wait for the GPU outlasts: the hold has passed before the next step and never binds.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PrefillPace"]

_MIN_TOKENS = 16  # the smallest chunk: a long prompt always progresses
_ALPHA = 0.5  # weight of the newest chunk in the average (the cost per token grows with the context)


class PrefillPace:
    """Chunk budgets from measured chunk costs, and the hold of a long prompt beside decoding rows (engine thread
    only). `clock` gives the host's seconds (tests pass their own)."""

    def __init__(self, step_ms: float, max_tokens: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.step_s = step_ms / 1000.0
        self.max_tokens = max_tokens
        self.clock = clock
        self._s_per_token: float | None = None
        self._hold_until = float("-inf")

    def budget(self) -> int:
        """Prompt tokens (padded width x rows) of this step's chunk."""
        if self.step_s <= 0 or not self._s_per_token:
            return self.max_tokens
        return max(min(self.max_tokens, _MIN_TOKENS), min(self.max_tokens, int(self.step_s / self._s_per_token)))

    def observe(self, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` (padded) took `seconds` of host time, ending now: its prompt's next chunk is held
        that long beside decoding rows (`holds`)."""
        self._hold_until = self.clock() + seconds
        if tokens <= 0:
            return
        cost = seconds / tokens
        self._s_per_token = cost if self._s_per_token is None else _ALPHA * cost + (1 - _ALPHA) * self._s_per_token

    def holds(self) -> bool:
        """Whether a prompt that has had a chunk waits this step, so that the decoding rows step alone (the host
        time since the last chunk is still below that chunk's own). Off with the pace (`prefill_step_ms` 0)."""
        return self.step_s > 0 and self.clock() < self._hold_until
