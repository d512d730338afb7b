"""Test and benchmark hooks: substitutions for what the models compute, never part of a served config.

`EngineHooks` is passed in code only (`Engine.create(cfg, hooks=...)`, `ModelBundle.load(cfg, hooks=...)`, the
bench scripts, `realtime-ming serve --hook NAME=VALUE`), never read from a YAML file or `--set`: a deployment's
`engine.*` config cannot turn them on. The models still compute every step; a hook only replaces a result, so
a benchmark with dummy weights exercises the segmenter and the talker with real words. The model bundle carries
them (`ModelBundle.hooks`), so every runner (and a talker process) sees the one object.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

__all__ = ["EngineHooks", "NO_HOOKS", "parse_hook", "parse_hooks"]


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """All off by default (None / 0 / 1)."""

    # every reply emits this text's tokens (cycled) instead of the sampled ones. `<|role_end|>` splits it into
    # per-turn replies (turn k of a conversation plays reply k mod n); `<tool_call>…</tool_call>` are the real
    # special tokens, so a forced call is parsed like the model's (`engine/forced.py`)
    forced_reply: str | None = None
    # transcription turns (`TurnTask.TRANSCRIBE`) emit this text's tokens once, then stop
    forced_transcript: str | None = None
    # every turn judgement (`TurnTask.JUDGE_TURN`, semantic_vad) answers this P(complete) in [0, 1]; its prefill
    # still runs
    forced_turn_judgement: float | None = None
    # > 0: each talker job speaks exactly (words x this) steps, the stop head ignored (a fixed talker length)
    steps_per_word: int = 0
    # N > 1: the thinker is built as rank 0 of a TP=N group alone on its one device, every collective skipped
    # (dummy weights; output meaningless): the per-GPU cost of a TP=N deployment where N GPUs are not at hand
    tp_shadow: int = 1

    def __post_init__(self):
        if self.forced_turn_judgement is not None and not 0.0 <= self.forced_turn_judgement <= 1.0:
            raise ValueError("hooks.forced_turn_judgement must be a probability in [0, 1]")
        if self.steps_per_word < 0:
            raise ValueError("hooks.steps_per_word must be >= 0")
        if self.tp_shadow < 1:
            raise ValueError("hooks.tp_shadow must be >= 1")

    def check(self, cfg) -> None:
        """Raise ValueError when these hooks do not fit engine config `cfg`."""
        if self.tp_shadow > 1 and (cfg.weights != "dummy" and cfg.model_path is not None
                                   or cfg.placement.tp_size > 1):
            raise ValueError("hooks.tp_shadow needs dummy weights (or a preset) and one thinker device")


NO_HOOKS = EngineHooks()


def parse_hooks(items: typing.Iterable[str]) -> EngineHooks | None:
    """The hooks of `--hook NAME=VALUE` arguments (None without any); ValueError names a bad one."""
    hooks = None
    for item in items:
        hooks = parse_hook(hooks or EngineHooks(), item)
    return hooks


def parse_hook(hooks: EngineHooks, item: str) -> EngineHooks:
    """`hooks` with one `NAME=VALUE` applied (the serve CLI's `--hook`); ValueError names a bad one."""
    name, sep, raw = item.partition("=")
    fields = {f.name: f for f in dataclasses.fields(EngineHooks)}
    if not sep or name not in fields:
        raise ValueError(f"--hook {item!r}: expected NAME=VALUE with NAME one of {sorted(fields)}")
    kind = typing.get_type_hints(EngineHooks)[name]
    try:
        value = int(raw) if kind is int else float(raw) if kind == (float | None) else raw
    except ValueError:
        raise ValueError(f"--hook {name}: {raw!r} is not a number") from None
    return dataclasses.replace(hooks, **{name: value})
