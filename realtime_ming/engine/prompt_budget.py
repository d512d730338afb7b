"""Fitting a conversation into the thinker's context: the `truncation` policy (OpenAI `session.truncation`).

The prompt is the system turn, one segment per history message (each starts with the `<role>`
token; text is encoded per segment, so segment lengths add up exactly) and the generation prompt.
Its budget is `max_seq_len` minus room for the reply: `min(max_tokens, max_seq_len // 2)`, so a
reply always has its full `max_tokens` or half the context. When the prompt is over budget:

- `auto`: the oldest messages are dropped until it fits (the fewest possible);
- `retention_ratio` r: history is dropped until it holds at most r x its limit, so the next turns
  fit without another cut and keep their cached prefix;
- `disabled`: `ContextLengthExceeded` (code `context_length_exceeded`); nothing is dropped.

The cut is a pure function of the history: it replays the conversation's growth message by
message, cutting whenever the limit is crossed, so the same history always gives the same cut,
and a history that only grew at its end keeps the cut of its earlier turns (the thinker's cached
prefix stays valid until the next cut). The system prompt is never dropped; the newest message
never either (a single message over the limit fails with `context_length_exceeded`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .api import Truncation

__all__ = ["CONTEXT_LENGTH_EXCEEDED", "ContextLengthExceeded", "FittedPrompt", "fit_prompt", "history_cut",
           "prompt_budget", "segment_lengths"]

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ContextLengthExceeded(ValueError):
    """The prompt cannot fit the context under the session's truncation policy."""

    code = CONTEXT_LENGTH_EXCEEDED

    def __init__(self, prompt_tokens: int, budget: int, reason: str):
        super().__init__(f"prompt of {prompt_tokens} tokens exceeds the context budget of {budget} tokens ({reason})")
        self.prompt_tokens = prompt_tokens
        self.budget = budget


class FittedPrompt:
    """The prompt that fits and how many of the oldest messages were left out of it."""

    __slots__ = ("prompt", "dropped")

    def __init__(self, prompt, dropped: int):
        self.prompt = prompt
        self.dropped = dropped


def prompt_budget(max_seq_len: int, max_tokens: int) -> int:
    """Prompt tokens allowed: the context minus the reply's room (its max_tokens, at most half the context)."""
    return max_seq_len - min(max_tokens, max_seq_len // 2)


def segment_lengths(ids: Sequence[int], role_id: int, num_messages: int) -> tuple[int, list[int]]:
    """(fixed tokens: system turn + generation prompt, [tokens of each message]) of a rendered prompt.

    Segments start at the `<role>` token: the first is the system turn, then one per message, then
    the generation prompt. Raises ValueError if the prompt does not have that shape.
    """
    starts = [i for i, t in enumerate(ids) if t == role_id]
    if len(starts) != num_messages + 2 or starts[0] != 0:
        raise ValueError(f"prompt has {len(starts)} role segments for {num_messages} messages")
    bounds = starts + [len(ids)]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    return lengths[0] + lengths[-1], lengths[1:-1]


def history_cut(lengths: Sequence[int], limit: int, policy: Truncation) -> int:
    """Index of the first message kept so that the kept history fits `limit` tokens under `policy`.

    Replays the growth of the history: each time the kept part crosses `limit`, the oldest messages
    are dropped until it holds at most `limit` (auto) or `retention_ratio x limit` tokens, keeping at
    least the newest message. Raises ContextLengthExceeded when even that does not fit, or (disabled)
    when anything would have to be dropped.
    """
    total = sum(lengths)
    if policy.mode == "disabled":
        if total > limit:
            raise ContextLengthExceeded(total, limit, "truncation is disabled")
        return 0
    target = limit * policy.retention_ratio if policy.mode == "retention_ratio" else limit
    cut, kept = 0, 0
    for end, n in enumerate(lengths):
        kept += n
        if kept > limit:
            while cut < end and kept > target:
                kept -= lengths[cut]
                cut += 1
    if kept > limit:
        raise ContextLengthExceeded(kept, limit, "the newest message alone is over the limit")
    return cut


def fit_prompt(build: Callable[[int], object], num_messages: int, role_id: int, *, max_seq_len: int, max_tokens: int,
               policy: Truncation) -> FittedPrompt:
    """Render the prompt (`build(first_message)` -> MultimodalPrompt of messages[first:]) within the budget.

    One render when the whole conversation fits; otherwise the cut is computed from its segment
    lengths and the kept messages are rendered once more.
    """
    budget = prompt_budget(max_seq_len, max_tokens)
    prompt = build(0)
    ids = prompt.input_ids
    fixed, lengths = segment_lengths(ids, role_id, num_messages)
    limit = budget - fixed
    if policy.post_instructions is not None:
        limit = min(limit, policy.post_instructions)
    if len(ids) <= budget and sum(lengths) <= limit:
        return FittedPrompt(prompt, 0)
    if limit < 1:
        raise ContextLengthExceeded(len(ids), budget, "the system prompt alone fills the context")
    cut = history_cut(lengths, limit, policy)
    return FittedPrompt(build(cut) if cut else prompt, cut)
