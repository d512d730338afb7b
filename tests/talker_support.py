"""Talker test helpers on the fixture checkpoint: its recorded steps, the special ids and texts of its cases, a loop's
close."""

from __future__ import annotations

import torch

from realtime_ming.model.cfm import sway
from realtime_ming.model.talker import TalkerSpecialIds, generate

ATOL = RTOL = 1e-4  # fixtures README: loop outputs, hidden states
SPECIAL_NAMES = {"im_start": "<|im_start|>", "im_end": "<|im_end|>", "vision_start": "<|vision_start|>",
                 "vision_pad": "<|vision_pad|>", "vision_end": "<|vision_end|>", "audio": "<audio>",
                 "audio_patch": "<audioPatch>"}


def _recorded_encoder(meta):
    """Test-side tokenizer: returns the ids the fixture recorded for each piece text."""
    table = {}
    for piece in meta["template"]["pieces"]:
        if table.setdefault(piece["text"], piece["ids"]) != piece["ids"]:
            raise AssertionError(f"fixture piece {piece['text']!r} has two encodings")
    return lambda text: list(table[text])


def case_special_ids(meta) -> TalkerSpecialIds:
    """The talker special ids of the case: the first id of each template piece that starts with the token."""
    found = {}
    for piece in meta["template"]["pieces"]:
        for field, name in SPECIAL_NAMES.items():
            if piece["text"].startswith(name):
                found.setdefault(field, piece["ids"][0])
    return TalkerSpecialIds(**found)


def case_speak_text(meta) -> str:
    """The synthesised text: the template piece right after the voice's prompt text."""
    texts = [piece["text"] for piece in meta["template"]["pieces"]]
    return texts[texts.index(meta["voice"]["prompt_text"]) + 1]


def _close(got, want, atol=ATOL):
    diff = (got.float() - want).abs().max().item()
    assert torch.allclose(got.float(), want, atol=atol, rtol=RTOL), f"max abs diff {diff:.3g}"


def _fixture_steps(talker, tensors, dtype=torch.float32, **kw):
    cast = lambda x: x.to(dtype)  # noqa: E731
    return list(generate(talker, cast(tensors["inputs_embeds"]), cast(tensors["prompt_wav_lat"]),
                         t_grid=sway(tensors["t_grid"]).to(dtype),
                         noise=lambda s: (cast(tensors["noise_y0"][s]), cast(tensors["noise_sde"][s])), **kw))
