"""Engine warm-up: short turns end to end at startup, so first-call costs are not the first user's."""

from __future__ import annotations

import logging
import threading

import numpy as np

from .api import Content, Message, SamplingParams, TurnCancelled, TurnDone, TurnFailed, TurnRequest

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


def warm_up(engine, timeout_s: float = 300.0) -> None:
    """Run short turns end to end through `engine` so first-call costs (allocator growth, kernel selection,
    Triton compiles, lazy imports) are paid at startup, not by the first user (moshi's `warmup`).
    Two turns: a short text one, then one with 5 s of quiet audio, so the audio encoder (on the encoder
    worker), the audio router's prefill path and both variants of the prefill expert kernel (<= and > 128
    tokens) are among them."""
    audio = (0.01 * np.random.default_rng(0).standard_normal(5 * 16000)).astype(np.float32)
    text = Content.of_text("Hello, warm up.")
    for i, content in enumerate(((text,), (text, Content.of_audio(audio, 16000)))):  # short, then > 128 tokens
        done = threading.Event()
        request = TurnRequest(f"warmup-{i}", f"__warmup_{i}__", (Message("user", content),),
                              sampling=SamplingParams(max_tokens=8, ignore_eos=True))
        engine.submit(request, lambda ev, done=done: done.set() if isinstance(ev, (TurnDone, TurnFailed,
                                                                                   TurnCancelled)) else None)
        if not done.wait(timeout_s):
            log.warning("engine warmup turn %d did not finish within %.0f s", i, timeout_s)
        engine.close_conversation(f"__warmup_{i}__")
