"""The Ming talker (`talker/model.safetensors`): prompt building, voice embeddings, step functions.

Reproduces docs/model.md §5.3 (LM input sequence), §5.4 (voice registration maths), §5.8 (heads)
and §5.9 (generation loop) of [MING] `modeling_bailing_talker.py` `BailingTalker2`
(`omni_audio_generation_func`, `register_prompt_wav`, `generate`, `CFMGraphExecutor`).
The loop is split into batchable steps — `prefill` / `decode_lm` (Qwen2 LM with a `KVCache`),
`tail_step` (CFM + Aggregator + stop head: the graph-captured part), `history_update` — and
`generate` is the batch-1 reference loop built from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from .campplus import SPEAKER_DIM
from .cfm import CFM, CFMParams, sway_time_grid
from .config import TalkerConfig
from .dit import Aggregator, DiT
from .kernels.selection import REFERENCE, Kernels
from .loader import load_weights, read_weight_map
from .qwen2 import KVCache, Qwen2Model

__all__ = [
    "SPK_DIM",
    "MAX_STEPS",
    "DEFAULT_MIN_NEW_TOKEN",
    "DEFAULT_INSTRUCTION_PROMPT",
    "TalkerSpecialIds",
    "TalkerPrompt",
    "build_talker_prompt",
    "is_music_caption",
    "VoicePrompt",
    "Talker",
    "load_talker",
    "initial_history",
    "history_update",
    "should_stop",
    "max_decode_steps",
    "duration_exceeded",
    "duration_step_cap",
    "TalkerStep",
    "generate",
]

SPK_DIM = SPEAKER_DIM  # CAMPPlus embedding width (192), hard-coded by the reference `spk_head`
DEFAULT_INSTRUCTION_PROMPT = "Please generate speech based on the following description.\n"
MAX_STEPS = 1000  # the reference loop's absolute cap
DEFAULT_MIN_NEW_TOKEN = 10  # [MING] (sglang-omni uses 3)
# Duration guard of the reference caller: stop once audio_s × 16000/5818 ≥ len(text) and audio_s > 2
_CHARS_PER_SECOND = 16000 / 5818
_MIN_GUARD_SECONDS = 2.0

_SYSTEM_PIECE = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
_USER_PIECE = "<|im_start|>user\n"
_VISION_START, _VISION_PAD, _VISION_END_NL = "<|vision_start|>", "<|vision_pad|>", "<|vision_end|>\n"
_TEXT_INPUT_PIECE = " Text input:\n"
_IM_END, _IM_END_NL = "<|im_end|>", "<|im_end|>\n"
_ASSISTANT_PIECE = "<|im_start|>assistant\n"
_AUDIO, _AUDIO_PATCH = "<audio>", "<audioPatch>"
_MUSIC_CAPTION_KEYS = ("Genre: ", "Mood: ", "Instrument: ", "Theme: ", "Duration: ")


@dataclass(frozen=True, slots=True)
class TalkerSpecialIds:
    """Ids of the talker tokenizer's special tokens (real Qwen2: 151644/151645/151652/151654/151653)."""

    im_start: int
    im_end: int
    vision_start: int
    vision_pad: int
    vision_end: int
    audio: int
    audio_patch: int


@dataclass(frozen=True, slots=True)
class TalkerPrompt:
    """Talker LM prompt: token ids and the slots whose embeddings are overwritten.

    speaker_slots: one position per speaker (the `<|vision_pad|>` right after `<|vision_start|>`);
    audio_slots: the `<audioPatch>` positions right after `<audio>`, one per prompt-audio patch.
    text_start: where the reply text's ids begin; everything before it (system … the voice's transcript)
    is the prompt's head, the same for every text in one voice (engine.talker_step.PromptHead).
    """

    input_ids: tuple[int, ...]
    speaker_slots: tuple[int, ...]
    audio_slots: tuple[int, ...]
    text_start: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


def is_music_caption(text: str) -> bool:
    """True when `text` holds every music-caption field; such text gets no " Text input:" line."""
    return all(key in text for key in _MUSIC_CAPTION_KEYS)


def _encode_special(encode: Callable[[str], list[int]], piece: str, expected: int, first_only: bool) -> list[int]:
    ids = list(encode(piece))
    ok = bool(ids) and ids[0] == expected and (first_only or len(ids) == 1)
    if not ok:
        want = f"to start with id {expected}" if first_only else f"to be the single id [{expected}]"
        raise ValueError(f"talker tokenizer: expected encode({piece!r}) {want}, got {ids[:8]}")
    return ids


def build_talker_prompt(
    encode: Callable[[str], list[int]],
    special: TalkerSpecialIds,
    text: str,
    *,
    instruction_prompt: str = DEFAULT_INSTRUCTION_PROMPT,
    num_speakers: int = 1,
    prompt_text: str | None = None,
    prompt_patches: int = 0,
    caption: str | None = None,
) -> TalkerPrompt:
    """Token ids of §5.3, each piece encoded separately with the talker tokenizer's `encode`.

    system + user + instruction_prompt + per speaker i (1-based) `  speaker_{i}:` `<|vision_start|>`
    `<|vision_pad|>` `<|vision_end|>\\n` + ` Text input:\\n` (omitted for music captions) +
    prompt_text + text + `<|im_end|>\\n` + `<|im_start|>assistant\\n` [+ caption + `<|im_end|>`] +
    `<audio>` + `<audioPatch>` × prompt_patches. The voice transcript and the patches are included
    only together (prompt_text given and prompt_patches > 0), as in the reference.
    Special pieces are checked against `special` (ValueError on a tokenizer mismatch).
    """
    if num_speakers < 0 or prompt_patches < 0:
        raise ValueError("num_speakers and prompt_patches must be >= 0")
    use_voice_prompt = prompt_text is not None and prompt_patches > 0
    ids: list[int] = []
    ids += _encode_special(encode, _SYSTEM_PIECE, special.im_start, first_only=True)
    ids += _encode_special(encode, _USER_PIECE, special.im_start, first_only=True)
    ids += encode(instruction_prompt)
    speaker_slots = []
    for i in range(num_speakers):
        ids += encode(f"  speaker_{i + 1}:")
        ids += _encode_special(encode, _VISION_START, special.vision_start, first_only=False)
        speaker_slots.append(len(ids))
        ids += _encode_special(encode, _VISION_PAD, special.vision_pad, first_only=False)
        ids += _encode_special(encode, _VISION_END_NL, special.vision_end, first_only=True)
    if not is_music_caption(text):
        ids += encode(_TEXT_INPUT_PIECE)
    if use_voice_prompt:
        ids += encode(prompt_text)
    text_start = len(ids)
    ids += encode(text)
    ids += _encode_special(encode, _IM_END_NL, special.im_end, first_only=True)
    ids += _encode_special(encode, _ASSISTANT_PIECE, special.im_start, first_only=True)
    if caption is not None:
        ids += encode(caption)
        ids += _encode_special(encode, _IM_END, special.im_end, first_only=False)
    ids += _encode_special(encode, _AUDIO, special.audio, first_only=False)
    audio_slots = []
    if use_voice_prompt:
        patch = _encode_special(encode, _AUDIO_PATCH, special.audio_patch, first_only=False)
        audio_slots = list(range(len(ids), len(ids) + prompt_patches))
        ids += patch * prompt_patches
    return TalkerPrompt(tuple(ids), tuple(speaker_slots), tuple(audio_slots), text_start)


@dataclass(frozen=True)
class VoicePrompt:
    """A registered voice in model space (§5.4): what the prompt and the history need.

    spk_embed [1, H] = spk_head(CAMPPlus 192-d) or None without CAMPPlus; prompt_lat [1, N, C]
    VAE latents (N divisible by the patch size); prompt_emb [1, N / patch, H] Aggregator outputs.
    """

    spk_embed: torch.Tensor | None
    prompt_lat: torch.Tensor
    prompt_emb: torch.Tensor

    @property
    def num_patches(self) -> int:
        return self.prompt_emb.shape[1]


class Talker(nn.Module):
    """`BailingTalker2` weights: `model` (Qwen2), `cfm.model` (DiT), `aggregator`, `stop_head`, `spk_head`.

    The Qwen2 LM ties its word embeddings but the talker never computes token logits, so there
    is no `lm_head` (none is stored either). `kernels` (default: the reference PyTorch ops) selects the
    Triton kernels every module runs.
    """

    def __init__(self, cfg: TalkerConfig, *, kernels: Kernels = REFERENCE):
        super().__init__()
        if cfg.llm is None:
            raise ValueError("TalkerConfig.llm (talker/llm/config.json) is required")
        hidden = cfg.llm.hidden_size
        if cfg.flowmodel.llm_cond_dim != hidden:
            raise ValueError(f"flowmodel.llm_cond_dim {cfg.flowmodel.llm_cond_dim} != talker LM hidden {hidden}")
        if cfg.flowmodel.in_channels != cfg.aggregator.in_channels:
            raise ValueError("flowmodel and aggregator in_channels (latent width) differ")
        if cfg.history_patch_size < cfg.patch_size:
            raise ValueError("history_patch_size must be >= patch_size")
        self.cfg, self.kernels = cfg, kernels
        self.model = Qwen2Model(cfg.llm, kernels=kernels)
        self.cfm = CFM(DiT(cfg.flowmodel, kernels=kernels))
        self.aggregator = Aggregator(cfg.aggregator, hidden, kernels=kernels)
        self.stop_head = nn.Linear(hidden, 2)
        self.spk_head = nn.Linear(SPK_DIM, hidden)

    @property
    def latent_dim(self) -> int:
        return self.cfg.flowmodel.in_channels

    @property
    def hidden_size(self) -> int:
        return self.cfg.llm.hidden_size

    # ---- prompt and voice -------------------------------------------------------------------

    def register_voice(self, spk_vector: torch.Tensor | None, prompt_lat: torch.Tensor) -> VoicePrompt:
        """Register a voice: spk_vector [1, 192] (CAMPPlus) or None, prompt_lat [1, N, C] → VoicePrompt."""
        p = self.cfg.patch_size
        if prompt_lat.dim() != 3 or prompt_lat.shape[0] != 1 or prompt_lat.shape[1] % p:
            raise ValueError(f"prompt_lat must be [1, N, C] with N divisible by {p}, got {tuple(prompt_lat.shape)}")
        emb = self.aggregator(prompt_lat.reshape(-1, p, prompt_lat.shape[-1]))  # [N/p, 1, H]
        spk = self.spk_head(spk_vector) if spk_vector is not None else None
        return VoicePrompt(spk, prompt_lat, emb.reshape(1, -1, emb.shape[-1]))

    def prompt_embeds(self, prompt: TalkerPrompt, spk_embeds: Sequence[torch.Tensor] = (),
                      prompt_emb: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings [1, T, H] with speaker / prompt-audio embeddings written into their slots.

        spk_embeds: one [1, H] (or [H]) per speaker slot; prompt_emb [1, len(audio_slots), H].
        """
        if len(spk_embeds) != len(prompt.speaker_slots):
            raise ValueError(f"{len(spk_embeds)} speaker embeddings for {len(prompt.speaker_slots)} speaker slots")
        n_audio = 0 if prompt_emb is None else prompt_emb.shape[1]
        if n_audio != len(prompt.audio_slots):
            raise ValueError(f"{n_audio} prompt-audio embeddings for {len(prompt.audio_slots)} audio slots")
        weight = self.model.embed_tokens.weight
        ids = torch.tensor([prompt.input_ids], dtype=torch.long)
        # through pinned memory on CUDA: a pageable copy would wait for the work already queued on the stream
        ids = ids.pin_memory().to(weight.device, non_blocking=True) if weight.is_cuda else ids.to(weight.device)
        embeds = self.model.embed_tokens(ids)
        for slot, se in zip(prompt.speaker_slots, spk_embeds):
            embeds[0, slot] = se.reshape(-1).to(embeds.dtype)
        if n_audio:
            start = prompt.audio_slots[0]
            embeds[0, start:start + n_audio] = prompt_emb[0].to(embeds.dtype)
        return embeds

    # ---- step functions (batched, no host syncs) ------------------------------------------------

    def prefill(self, embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """LM over prompts embeds [B, T, H] at positions [B, T] (-1 = right padding) → h [B, 1, H].

        h is the final-normed hidden state at each row's last valid position; padding tokens write
        their K/V to the cache's sink slot, which no query sees.
        """
        hidden = self.model(embeds, positions, cache)
        last = positions.argmax(dim=1)  # positions increase along a row; padding is -1
        return hidden.gather(1, last[:, None, None].expand(-1, 1, hidden.shape[-1]))

    def decode_lm(self, embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One LM position per row: embeds [B, 1, H] (previous aggregator output), positions [B, 1] → h [B, 1, H].

        An idle row may pass position -1: its output is garbage, its K/V go to the sink slot.
        """
        return self.model(embeds, positions, cache)

    def stop_probs(self, h: torch.Tensor) -> torch.Tensor:
        """softmax(stop_head(h_last)) [B, 2]; column 1 = stop."""
        return self.stop_head(h[:, -1]).softmax(dim=-1)

    def tail_step(self, h: torch.Tensor, his: torch.Tensor, y0: torch.Tensor, sde_rnd: torch.Tensor,
                  t_grid: torch.Tensor, sde_args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """CFM sample + Aggregator + stop head (the reference's `CFMGraphExecutor` graph).

        h [B, 1, H]; his [B, Hh, C]; y0 [B, P, C]; sde_rnd [S, B, P, C]; t_grid [S+1] swayed
        (`sway_time_grid`); sde_args [3] or [B, 3] (cfg, sigma, temperature).
        Returns gen_lat [B, P, C], next_embed [B, 1, H], stop_prob [B, 2].
        """
        gen_lat = self.cfm.sample(h, his, y0, t_grid, sde_args, sde_rnd)
        return gen_lat, self.aggregator(gen_lat), self.stop_probs(h)


def load_talker(cfg: TalkerConfig, weights: str | Path, *, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, kernels: Kernels = REFERENCE) -> Talker:
    """Build on meta and strictly load `talker/model.safetensors` (or its folder) in eval mode."""
    with torch.device("meta"):
        talker = Talker(cfg, kernels=kernels)
    load_weights(talker, read_weight_map(weights), device=device, dtype=dtype, what="talker")
    return talker.eval()


def initial_history(prompt_lat: torch.Tensor | None, history_len: int, latent_dim: int, *,
                    device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[1, history_len, C] zeros with the last min(N, history_len) prompt latents right-aligned."""
    his = torch.zeros(1, history_len, latent_dim, device=device, dtype=dtype)
    if prompt_lat is not None and prompt_lat.shape[1] > 0:
        tail = prompt_lat[:, -history_len:]
        his[:, history_len - tail.shape[1]:] = tail.to(device=his.device, dtype=dtype)
    return his


def history_update(his: torch.Tensor, gen_lat: torch.Tensor) -> torch.Tensor:
    """Slide the history: drop the oldest P frames of his [B, Hh, C], append gen_lat [B, P, C]."""
    return torch.cat((his[:, gen_lat.shape[1]:], gen_lat), dim=1)


def should_stop(step: int, p_stop: float, min_new_token: int = DEFAULT_MIN_NEW_TOKEN) -> bool:
    """The reference stop rule, applied after emitting step `step`'s patch (0-based)."""
    return step > min_new_token and p_stop > 0.5


def max_decode_steps(prefill_len: int, cache_capacity: int, limit: int = MAX_STEPS) -> int:
    """Steps the loop may run: step < 1000 and step < cache length − prefill length."""
    return max(0, min(limit, cache_capacity - prefill_len))


def duration_exceeded(emitted_seconds: float, text_len: int) -> bool:
    """Reference duration guard, checked before consuming the next chunk: ≈0.364 s/char and > 2 s."""
    if emitted_seconds <= 0:
        return False
    return emitted_seconds * _CHARS_PER_SECOND >= text_len and emitted_seconds > _MIN_GUARD_SECONDS


def duration_step_cap(text_len: int, seconds_per_step: float) -> int:
    """Newer sglang-omni form of the guard as a step cap: max(2 s, len·0.364 s) / seconds_per_step."""
    return max(1, int(max(_MIN_GUARD_SECONDS, text_len * (5818 / 16000)) / seconds_per_step))


@dataclass(frozen=True)
class TalkerStep:
    """One emitted patch of the reference loop, with the tensors that produced it."""

    step: int
    his_in: torch.Tensor  # [1, Hh, C] history the CFM saw
    hidden: torch.Tensor  # [1, 1, H] LM hidden state
    gen_lat: torch.Tensor  # [1, P, C]
    next_embed: torch.Tensor  # [1, 1, H]
    stop_prob: torch.Tensor  # [1, 2]
    last: bool


NoiseFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def _random_noise(talker: Talker, device, dtype, generator: torch.Generator | None) -> NoiseFn:
    """The reference's draws per step: y0 [1, P, C] first, then sde_rnd [S, 1, P, C]."""
    shape = (1, talker.cfg.patch_size, talker.latent_dim)

    def draw(step: int):
        y0 = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        return y0, torch.randn((talker.cfg.steps, *shape), generator=generator, device=device, dtype=dtype)

    return draw


@torch.no_grad()
def generate(
    talker: Talker,
    embeds: torch.Tensor,
    prompt_lat: torch.Tensor | None = None,
    *,
    params: CFMParams = CFMParams(),
    min_new_token: int = DEFAULT_MIN_NEW_TOKEN,
    cache_capacity: int = 2048,
    max_steps: int | None = None,
    t_grid: torch.Tensor | None = None,
    noise: NoiseFn | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[TalkerStep]:
    """Reference loop for one prompt (batch 1), §5.9; yields every patch, the last one flagged.

    embeds [1, T, H] from `Talker.prompt_embeds`; prompt_lat [1, N, C] seeds the history;
    t_grid defaults to the swayed grid in the activation dtype (bf16 in production);
    noise(step) -> (y0, sde_rnd) overrides the random draws (reproducible tests).
    """
    device, dtype = embeds.device, embeds.dtype
    cfg = talker.cfg
    his = initial_history(prompt_lat, cfg.history_patch_size, talker.latent_dim, device=device, dtype=dtype)
    cache = KVCache.allocate(cfg.llm, 1, cache_capacity, device, dtype)
    t_grid = sway_time_grid(cfg.steps, dtype, device) if t_grid is None else t_grid
    sde_args = params.tensor(device, dtype)
    noise = noise or _random_noise(talker, device, dtype, generator)
    prefill_len = embeds.shape[1]
    limit = max_decode_steps(prefill_len, cache_capacity)
    if max_steps is not None:
        limit = min(limit, max_steps)
    next_embed = None
    for step in range(limit):
        if step == 0:
            positions = torch.arange(prefill_len, device=device)[None]
            h = talker.prefill(embeds, positions, cache)
        else:
            positions = torch.full((1, 1), prefill_len + step - 1, device=device, dtype=torch.long)
            h = talker.decode_lm(next_embed, positions, cache)
        y0, sde_rnd = noise(step)
        gen_lat, next_embed, stop_prob = talker.tail_step(h, his, y0, sde_rnd, t_grid, sde_args)
        his_in, his = his, history_update(his, gen_lat)
        last = should_stop(step, float(stop_prob[0, 1]), min_new_token) or step + 1 >= limit
        yield TalkerStep(step, his_in, h, gen_lat, next_embed, stop_prob, last)
        if last:
            return
