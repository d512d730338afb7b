"""Fitting a conversation into the thinker's context: the `truncation` policy (OpenAI `session.truncation`).

The prompt is the system turn, one segment per role turn of the history (each starts with the `<role>`
token; text is encoded per segment, so segment lengths add up exactly) and the generation prompt. Consecutive
function results ("tool" messages) share one `<role>OBSERVATION</role>` segment, as the chat template renders
them. Its budget is `max_seq_len` minus room for the reply: `min(max_tokens, max_seq_len // 2)`, so a reply
always has its full `max_tokens` or half the context.

History is cut in units: a message, with the function results that follow it (an assistant's calls and their
results are kept or dropped together; no result is left without its call). When the prompt is over budget:

- `auto`: as `retention_ratio` with the engine's `engine.thinker.auto_truncation_ratio` (one larger cut, so
  that the turns after it reuse the cached prefix; 1.0 drops the fewest units possible at every turn);
- `retention_ratio` r: history is dropped until it holds at most r x its limit, so the next turns
  fit without another cut and keep their cached prefix;
- `disabled`: `ContextLengthExceeded` (code `context_length_exceeded`); nothing is dropped.

The cut replays the conversation's growth unit by unit, cutting whenever the limit is crossed, so the same
history always gives the same cut, and a history that only grew at its end keeps the cut of its earlier turns
(the thinker's cached prefix stays valid until the next cut). The caller may name where the previous turn's
prompt began (`sticky`): while the history from there fits, the cut stays there, and the next cut replays from
there, so a session that also forgets its oldest items (`max_items`) does not move the cut every turn.
The system prompt is never dropped; the newest unit never either (a newest unit over the limit fails with
`context_length_exceeded`; an older one over the limit is dropped once a newer unit arrives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .api import Truncation

__all__ = ["CONTEXT_LENGTH_EXCEEDED", "ContextLengthExceeded", "FittedPrompt", "fit_prompt", "history_cut",
           "prompt_budget", "segment_lengths", "segment_starts", "unit_starts"]

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ContextLengthExceeded(ValueError):
    """The prompt cannot fit the context under the session's truncation policy."""

    code = CONTEXT_LENGTH_EXCEEDED

    def __init__(self, prompt_tokens: int, budget: int, reason: str):
        super().__init__(f"prompt of {prompt_tokens} tokens exceeds the context budget of {budget} tokens ({reason})")
        self.prompt_tokens = prompt_tokens
        self.budget = budget


class FittedPrompt:
    """The prompt that fits and how many of the oldest messages were left out of it (always a unit boundary)."""

    __slots__ = ("prompt", "dropped")

    def __init__(self, prompt, dropped: int):
        self.prompt = prompt
        self.dropped = dropped


def prompt_budget(max_seq_len: int, max_tokens: int) -> int:
    """Prompt tokens allowed: the context minus the reply's room (its max_tokens, at most half the context)."""
    return max_seq_len - min(max_tokens, max_seq_len // 2)


def segment_starts(roles: Sequence[str]) -> list[int]:
    """Indices of the messages that open a role segment: all but a "tool" message right after another (the
    chat template puts consecutive function results in one `<role>OBSERVATION</role>` turn)."""
    return [i for i, role in enumerate(roles) if not (role == "tool" and i and roles[i - 1] == "tool")]


def unit_starts(roles: Sequence[str]) -> list[int]:
    """Indices of the messages that open a truncation unit: all but function results ("tool"), which stay with
    the message before them (the assistant turn holding their calls) unless they open the history."""
    return [i for i, role in enumerate(roles) if role != "tool" or i == 0]


def segment_lengths(ids: Sequence[int], role_id: int, num_segments: int) -> tuple[int, list[int]]:
    """(fixed tokens: system turn + generation prompt, [tokens of each history segment]) of a rendered prompt.

    Segments start at the `<role>` token: the first is the system turn, then one per role turn of the history
    (`segment_starts`), then the generation prompt. Raises ValueError if the prompt does not have that shape.
    """
    starts = [i for i, t in enumerate(ids) if t == role_id]
    if len(starts) != num_segments + 2 or starts[0] != 0:
        raise ValueError(f"prompt has {len(starts)} role segments for {num_segments} history segments")
    bounds = starts + [len(ids)]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    return lengths[0] + lengths[-1], lengths[1:-1]


def _unit_lengths(roles: Sequence[str], segment_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """([first message of each unit], [tokens of each unit]) from the tokens of each role segment."""
    units = unit_starts(roles)
    lengths = [0] * len(units)
    u = 0
    for start, n in zip(segment_starts(roles), segment_tokens):
        while u + 1 < len(units) and units[u + 1] <= start:
            u += 1
        lengths[u] += n
    return units, lengths


def history_cut(lengths: Sequence[int], limit: int, policy: Truncation) -> int:
    """Index of the first unit kept so that the kept history (`lengths`: tokens per unit) fits `limit` tokens.

    Replays the growth of the history: each time the kept part crosses `limit`, the oldest units are
    dropped until it holds at most `retention_ratio x limit` tokens (auto and retention_ratio alike: the
    engine gives `auto` its configured ratio), keeping at least the newest unit. Raises ContextLengthExceeded
    when even that does not fit, or (disabled) when anything would have to be dropped.
    """
    total = sum(lengths)
    if policy.mode == "disabled":
        if total > limit:
            raise ContextLengthExceeded(total, limit, "truncation is disabled")
        return 0
    target = limit * policy.retention_ratio
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


def fit_prompt(build: Callable[[int], object], roles: Sequence[str], role_id: int, *, max_seq_len: int,
               max_tokens: int, policy: Truncation, sticky: int | None = None) -> FittedPrompt:
    """Render the prompt (`build(first_message)` -> MultimodalPrompt of messages[first:]) within the budget.

    `roles` are the history's message roles; `sticky` the message the previous turn's prompt began with, if
    it is still in the history. One render when the whole conversation fits; otherwise the cut is computed
    from its unit lengths and the kept messages are rendered once more.
    """
    budget = prompt_budget(max_seq_len, max_tokens)
    # from where the previous prompt began (the cut never goes back before it): a long conversation is not
    # rendered whole every turn, only what the context can hold and the turns since
    start = sticky if sticky is not None and policy.mode != "disabled" and sticky in unit_starts(roles) else 0
    roles = roles[start:]
    prompt = build(start)
    ids = prompt.input_ids
    fixed, segment_tokens = segment_lengths(ids, role_id, len(segment_starts(roles)))
    limit = budget - fixed
    if policy.post_instructions is not None:
        limit = min(limit, policy.post_instructions)
    if len(ids) <= budget and sum(segment_tokens) <= limit:
        return FittedPrompt(prompt, start)
    if limit < 1:
        raise ContextLengthExceeded(len(ids), budget, "the system prompt alone fills the context")
    units, lengths = _unit_lengths(roles, segment_tokens)
    if not units:
        return FittedPrompt(prompt, start)
    cut = start + units[history_cut(lengths, limit, policy)]
    return FittedPrompt(build(cut) if cut != start else prompt, cut)
