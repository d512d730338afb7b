"""Forced thinker tokens: a turn's forced prefix (a required / named function call) and the forced reply.

`TurnRequest.forced_prefix` is constrained decoding of a reply's start: its tokens replace the sampled
ones until it is written, then the model goes on from it. `engine.thinker.forced_reply` (tests, demos and
benchmarks with random weights) replaces every sampled token: it is split after each `<|role_end|>` into
segments, and a turn plays the segment picked by the number of assistant messages in its history (so a
forced tool call can be followed by a forced answer); a segment without the end token is cycled. With a
forced prefix too, a segment that contains the prefix plays from it; otherwise the prefix comes first. Tool
markers and `<|role_end|>` in either are their special tokens, exactly as the real model would emit them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Forced", "forced_segments", "forced_token", "plan_forced"]


@dataclass(frozen=True, slots=True)
class Forced:
    """The tokens a row must emit from its first generated token on; `cycle` repeats them."""

    ids: tuple[int, ...]
    cycle: bool


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
    """What `request` must emit: its forced prefix, then (forced-reply mode) its segment."""
    prefix = tuple(tok.encode_markup(request.forced_prefix)) if request.forced_prefix else ()
    if not segments:
        return Forced(prefix, False) if prefix else None
    turn = sum(1 for m in request.history if m.role == "assistant")
    seg = segments[turn % len(segments)]
    at = _find(seg, prefix)  # a segment holding the forced call plays from it, as a constrained model would
    ids = seg[at:] if at is not None else prefix + seg
    return Forced(ids, seg[-1] != tok.eos_id or request.sampling.ignore_eos)


def _find(ids: tuple[int, ...], part: tuple[int, ...]) -> int | None:
    """Where `part` first occurs in `ids` (0 for an empty `part`), else None."""
    for i in range(len(ids) - len(part) + 1):
        if ids[i:i + len(part)] == part:
            return i
    return None


def forced_token(forced: Forced | None, generated: int, sampled: int) -> int:
    """The token to emit as the row's `generated`-th: forced while the plan lasts, else the sampled one."""
    if forced is None or not forced.ids:
        return sampled
    if generated < len(forced.ids):
        return forced.ids[generated]
    return forced.ids[generated % len(forced.ids)] if forced.cycle else sampled
