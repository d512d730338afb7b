"""`response.done.usage` from the engine's `TurnDone` (README "Usage").

Input tokens are split by modality as the engine laid out the prompt: audio / image = the media
placeholder tokens (video frames count as image), text = every other prompt token; cached tokens are the
prefix reused from the conversation's KV cache, split the same way. Output text tokens are the thinker's
generated tokens; output audio tokens are talker steps (one autoregressive step of the talker = one latent
patch, about 0.32 s of speech at the nominal rate), 0 for text responses. An engine that does not split
the prompt (scripted test engines) reports it all as text.
"""

from __future__ import annotations

from ..engine.api import PromptTokens, TurnDone
from ..protocol.responses import Usage

__all__ = ["usage_of"]


def usage_of(done: TurnDone) -> Usage:
    """The wire usage of a finished turn."""
    prompt = done.prompt or PromptTokens(text=done.prompt_tokens)
    cached = done.cached or PromptTokens(text=done.cached_tokens)
    return Usage(
        input_text_tokens=prompt.text,
        input_audio_tokens=prompt.audio,
        input_image_tokens=prompt.image,
        input_cached_tokens=cached.total,
        input_cached_text_tokens=cached.text,
        input_cached_audio_tokens=cached.audio,
        input_cached_image_tokens=cached.image,
        output_text_tokens=done.output_tokens,
        output_audio_tokens=done.talker_steps,
    )
