"""How large a prefill chunk may be: every decoding row's next token, and every prompt queued behind, waits for it.

`PrefillPace` keeps the host seconds per (padded) chunk token of the recent chunks, an exponential average that
follows the cost as a long prompt's context grows, and cuts a chunk to what fits `engine.thinker.prefill_step_ms`.
Where the host only launches the work (CUDA), a chunk costs it microseconds and the cut never binds; where it
computes the chunk itself (CPU) a 256-token chunk deep into a 4,000-token image prompt takes ~0.5 s or more, and
every other session's stream, and the next prompt of a session whose reply just ended (no row decodes at that
moment), would stall that long per chunk. Chunk after chunk a prompt runs at the same speed in smaller pieces.
"""

from __future__ import annotations

__all__ = ["PrefillPace"]

_MIN_TOKENS = 16  # the smallest chunk: a long prompt always progresses
_ALPHA = 0.5  # weight of the newest chunk in the average (the cost per token grows with the context)


class PrefillPace:
    """Chunk budgets from measured chunk costs (engine thread only)."""

    def __init__(self, step_ms: float, max_tokens: int) -> None:
        self.step_s = step_ms / 1000.0
        self.max_tokens = max_tokens
        self._s_per_token: float | None = None

    def budget(self) -> int:
        """Prompt tokens (padded width x rows) of this step's chunk."""
        if self.step_s <= 0 or not self._s_per_token:
            return self.max_tokens
        return max(min(self.max_tokens, _MIN_TOKENS), min(self.max_tokens, int(self.step_s / self._s_per_token)))

    def observe(self, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` (padded) took `seconds` of host time."""
        if tokens <= 0:
            return
        cost = seconds / tokens
        self._s_per_token = cost if self._s_per_token is None else _ALPHA * cost + (1 - _ALPHA) * self._s_per_token
