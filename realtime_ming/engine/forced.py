"""Forced thinker tokens: a turn's forced prefix (a required / named function call) and the forced reply.

`TurnRequest.forced_prefix` is constrained decoding of a reply's start: its tokens replace the sampled
ones until it is written, then the model goes on from it. With `TurnRequest.forced_choices` the reply
starts with `forced_prefix` + one of the choices (each tokenized whole, as the model would write it): where
the remaining choices all agree the token is forced; where they differ the model chooses — its logits are
masked to the tokens the choices still allow (`allowed_tokens`, applied before sampling), so what it writes
is always one of them (a `required` tool call names an offered function).

The `forced_reply` hook (`engine/hooks.py`: tests, demos and benchmarks with random weights) replaces every sampled token:
it is split after each `<|role_end|>` into segments, and a turn plays the segment picked by the number of
assistant messages in its history (so a forced tool call can be followed by a forced answer); a segment
without the end token is cycled. With a forced prefix (choices) too, a segment that contains it (one of them)
plays from there; otherwise it (the first choice) comes first. Tool markers and `<|role_end|>` in either are
their special tokens, exactly as the real model would emit them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Forced", "allowed_tokens", "forced_segments", "forced_token", "plan_forced"]


@dataclass(frozen=True, slots=True)
class Forced:
    """The tokens a row must emit from its first generated token on; `cycle` repeats them. `choices`: the
    row must start with one of these token sequences (a constrained choice; never with `ids`)."""

    ids: tuple[int, ...]
    cycle: bool
    choices: tuple[tuple[int, ...], ...] = ()


def forced_segments(tok, text: str) -> tuple[tuple[int, ...], ...]:
    """The forced reply's token segments, each ending with the end token except perhaps the last."""
    ids, segments, start = tok.encode_markup(text), [], 0
    for i, tid in enumerate(ids):
        if tid == tok.eos_id:
            segments.append(tuple(ids[start:i + 1]))
            start = i + 1
    if start < len(ids):
        segments.append(tuple(ids[start:]))
    return tuple(s for s in segments if s)


def plan_forced(tok, request, segments) -> Forced | None:
    """What `request` must emit: its forced prefix (or one of its forced choices), then (forced-reply mode)
    its segment."""
    starts = [request.forced_prefix + choice for choice in request.forced_choices] or [request.forced_prefix]
    choices = tuple(dict.fromkeys(tuple(tok.encode_markup(s)) for s in starts if s))
    if not segments:
        if not choices:
            return None
        return Forced(choices[0], False) if len(choices) == 1 else Forced((), False, choices)
    turn = sum(1 for m in request.history if m.role == "assistant")
    seg = segments[turn % len(segments)]
    cycle = seg[-1] != tok.eos_id or request.sampling.ignore_eos
    for choice in choices or ((),):  # a segment holding a forced call plays from it, as a constrained model would
        at = _find(seg, choice)
        if at is not None:
            return Forced(seg[at:], cycle)
    return Forced(choices[0] + seg, cycle)


def _find(ids: tuple[int, ...], part: tuple[int, ...]) -> int | None:
    """Where `part` first occurs in `ids` (0 for an empty `part`), else None."""
    for i in range(len(ids) - len(part) + 1):
        if ids[i:i + len(part)] == part:
            return i
    return None


def allowed_tokens(forced: Forced | None, generated: list[int]) -> tuple[int, ...] | None:
    """The tokens a row with a constrained choice may emit next (sorted), or None when it is unconstrained:
    the next token of every choice that `generated` is still a prefix of."""
    if forced is None or not forced.choices:
        return None
    n = len(generated)
    allowed = {c[n] for c in forced.choices if len(c) > n and list(c[:n]) == generated}
    return tuple(sorted(allowed)) or None


def forced_token(forced: Forced | None, generated: list[int], sampled: int) -> int:
    """The token to emit after `generated`: forced while the plan lasts (within a choice: the sampled
    token when the choice allows it, which masked sampling ensures), else the sampled one."""
    allowed = allowed_tokens(forced, generated)
    if allowed is not None:
        return sampled if sampled in allowed else allowed[0]
    if forced is None or not forced.ids:
        return sampled
    n = len(generated)
    if n < len(forced.ids):
        return forced.ids[n]
    return forced.ids[n % len(forced.ids)] if forced.cycle else sampled
