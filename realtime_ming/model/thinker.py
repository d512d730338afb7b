"""Thinker LM: BailingMoeV2 (Ling-2.0 flash MoE) in pure PyTorch, with a static multi-slot KV cache.

Reproduces `BailingMoeV2ForCausalLM` (docs/model.md §1.2–1.5, keys §1.7; loaded with prefix
`model.`): fused QKV split [Q heads | K heads | V heads], per-head q/k RMSNorm before partial 3-D
RoPE, GQA causal attention, dense layer 0, sparse MoE layers (moe.py), final RMSNorm, untied lm_head.
`ThinkerKVCache` holds every slot's K/V addressed by absolute cache position, so slots at different
lengths decode together and a conversation's earlier turns stay cached between turns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .config import ThinkerConfig, load_checkpoint_config
from .kernels.rotary import RotaryStyle, head_rotary
from .kernels.sdpa import attention_any_length
from .kernels.selection import REFERENCE, Kernels
from .kernels.slot_attention import decode_attention, prefill_attention, prefill_attention_supported
from .layers import (
    SINGLE,
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    prenorm_stack,
)
from .loader import load_weights, read_weight_map
from .moe import DenseMLP, SparseMoeBlock
from .qwen2 import causal_window_mask
from .rope3d import ThinkerRotary

__all__ = ["Thinker", "ThinkerKVCache", "load_thinker"]

_EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass
class ThinkerKVCache:
    """Static K/V for `num_slots` conversations: k, v [layers, slots, kv_heads_local, capacity + 1, head_dim].

    Index p holds the token at cache position p (no ring: positions must stay < capacity). The extra
    last column is a sink for padding rows (cache position -1), so padded batch rows never touch a
    real slot. No per-slot state or reset is needed: a query at position q sees exactly indices
    0..q of its slot, all of which the slot's own prefill/decode wrote.
    """

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def allocate(cls, cfg: ThinkerConfig, num_slots: int, capacity: int, *, device="cpu",
                 dtype: torch.dtype = torch.float32, tp: TPGroup = SINGLE) -> "ThinkerKVCache":
        kv_heads = tp.heads(cfg.num_key_value_heads, "num_key_value_heads")
        shape = (cfg.num_hidden_layers, num_slots, kv_heads, capacity + 1, cfg.resolved_head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def capacity(self) -> int:
        return self.k.shape[3] - 1

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]


class ThinkerAttention(nn.Module):
    """`BailingMoeV2Attention`: keys query_key_value / q_norm / k_norm / dense."""

    def __init__(self, cfg: ThinkerConfig, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.kernels = kernels
        hd = cfg.resolved_head_dim
        self.head_dim = hd
        self.num_heads = tp.divide(cfg.num_attention_heads, "num_attention_heads")
        self.num_kv = tp.heads(cfg.num_key_value_heads, "num_key_value_heads")
        q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
        self.query_key_value = ColumnParallelLinear(cfg.hidden_size, q + 2 * kv, bias=cfg.use_qkv_bias, tp=tp,
                                                    splits=(q, (kv, cfg.num_key_value_heads), (kv, cfg.num_key_value_heads)),
                                                    kernels=kernels)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, kernels=kernels)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, kernels=kernels)
        self.dense = RowParallelLinear(q, cfg.hidden_size, bias=cfg.use_bias, tp=tp, kernels=kernels)

    def forward(self, x, cos, sin, mask, kv=None, slots=None, write_idx=None, kv_len=None, lengths=None):
        """`lengths` (with a cache, the fused kernels on) = cache indices each query sees, read in place:
        [B] for a one-token decode step, [B, T] for a prompt chunk; `mask` and `kv_len` are then unused."""
        b, t, _ = x.shape
        qkv = self.query_key_value(x)
        args = (qkv, self.num_heads, self.num_kv, self.head_dim, cos, sin, RotaryStyle.NEOX_ROUND_EACH)
        norms = dict(q_norm=self.q_norm.weight, k_norm=self.k_norm.weight, eps=self.q_norm.eps,
                     kernels=self.kernels)
        if kv is None:
            q, k, v = head_rotary(*args, **norms)
        else:
            ck, cv = kv  # [slots, kv, capacity + 1, hd] views into the cache
            q, _, _ = head_rotary(*args, **norms, k_out=ck, v_out=cv, rows=slots, index=write_idx)
            if lengths is not None:  # every row reads its own slot in place
                attend = decode_attention if lengths.dim() == 1 else prefill_attention
                out = attend(q, ck, cv, slots, lengths, kernels=self.kernels)
                return self.dense(out.transpose(1, 2).reshape(b, t, -1))
            k = ck[:, :, :kv_len].index_select(0, slots)
            v = cv[:, :, :kv_len].index_select(0, slots)
        out = attention_any_length(q, k, v, attn_mask=mask, enable_gqa=self.num_kv != self.num_heads)
        return self.dense(out.transpose(1, 2).reshape(b, t, -1))


class ThinkerLayer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + ffn(norm(x)); ffn dense (layer < k) or MoE.

    `forward` takes the residual x and h = input_layernorm(x) and returns (x after attention, the
    ffn output): the residual adds run fused with the norm after them (`Thinker.forward`).
    """

    def __init__(self, cfg: ThinkerConfig, index: int, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE,
                 expert_dtype: str = "model"):
        super().__init__()
        self.index = index
        self.attention = ThinkerAttention(cfg, tp, kernels=kernels)
        self.is_moe = index >= cfg.first_k_dense_replace
        self.mlp = (SparseMoeBlock(cfg, tp, kernels=kernels, expert_dtype=expert_dtype) if self.is_moe
                    else DenseMLP(cfg.hidden_size, cfg.intermediate_size, tp, kernels=kernels))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)

    def forward(self, x, h, cos, sin, mask, kv, slots, write_idx, kv_len, lengths, image_mask, audio_mask, routing,
                live=None):
        h, x = self.post_attention_layernorm.add(x, self.attention(h, cos, sin, mask, kv, slots, write_idx, kv_len,
                                                                  lengths))
        if self.is_moe:
            return x, self.mlp(h, image_mask, audio_mask, routing, self.index, live)
        return x, self.mlp(h)


class ThinkerModel(nn.Module):
    """`BailingMoeV2Model` body: keys word_embeddings / layers.N / norm."""

    def __init__(self, cfg: ThinkerConfig, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE,
                 expert_dtype: str = "model"):
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(ThinkerLayer(cfg, i, tp, kernels=kernels, expert_dtype=expert_dtype)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels=kernels)
        self.rotary = ThinkerRotary(cfg.rotary_dim, cfg.rope_theta, cfg.is_video_rope)


class Thinker(nn.Module):
    """`BailingMoeV2ForCausalLM` (load with prefix `model.`): forward -> final-normed hidden states.

    `kernels` (default: the reference PyTorch ops) selects the Triton kernels every module runs;
    `expert_dtype` "fp8" stores the routed experts in e4m3 (moe.SparseMoeBlock), "model" in the model dtype."""

    def __init__(self, cfg: ThinkerConfig, tp: TPGroup = SINGLE, *, kernels: Kernels = REFERENCE,
                 expert_dtype: str = "model"):
        super().__init__()
        self.cfg, self.tp, self.kernels, self.expert_dtype = cfg, tp, kernels, expert_dtype
        self.model = ThinkerModel(cfg, tp, kernels=kernels, expert_dtype=expert_dtype)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp, kernels=kernels)
        attn = self.model.layers[0].attention  # this rank's attention shapes suit the prefill kernel
        self._prefill_kernel = prefill_attention_supported(attn.num_heads, attn.num_kv, attn.head_dim)

    @staticmethod
    def checkpoint_key_map(key: str) -> tuple[str | None, object]:
        """Per-expert checkpoint keys -> the stacked parameters (shard (e, 0|1) for gate|up, e for down)."""
        m = _EXPERT_KEY.match(key)
        if m is None:
            return key, None
        layer, expert, proj = m.group(1), int(m.group(2)), m.group(3)
        base = f"model.layers.{layer}.mlp."
        if proj == "down_proj":
            return base + "experts_down", expert
        return base + "experts_gate_up", (expert, 0 if proj == "gate_proj" else 1)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> embeddings [B, T, D] (ids clamped to [0, vocab-1] as the reference does)."""
        return self.model.word_embeddings(ids.clamp(0, self.cfg.vocab_size - 1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head in the model dtype, returned as fp32 [..., vocab] (full vocab on every TP rank)."""
        return self.lm_head(hidden).float()

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        cache: ThinkerKVCache | None = None,
        slots: torch.Tensor | None = None,
        cache_positions: torch.Tensor | None = None,
        kv_len: int | None = None,
        image_mask: torch.Tensor | None = None,
        audio_mask: torch.Tensor | None = None,
        routing: list | None = None,
        layers: range | None = None,
    ) -> torch.Tensor:
        """Run the decoder stack; returns final-normed hidden states [B, T, D].

        inputs_embeds [B, T, D]; position_ids [3, B, T] int64 rotary positions (t, h, w).
        cache_positions [B, T] int64: absolute index of each token in its slot (-1 = padding row,
        written to the sink, its output is garbage); default 0..T-1. With `cache`, `slots` [B] int64
        names each row's slot: the tokens are written at their positions and attend to indices
        0..position of that slot; only the first `kv_len` indices are read (default: capacity; must
        exceed every position in the batch). Without a cache the T tokens attend causally among
        themselves. image_mask / audio_mask [B, T] bool select the image/audio router per token
        (multimodal prefill only; None = text gate, as in decode). `routing`, if a list, receives
        one moe.Routing per MoE layer. `layers` (benchmarks) runs only that range of the stack.
        """
        b, t, _ = inputs_embeds.shape
        device = inputs_embeds.device
        if cache_positions is None:
            cache_positions = torch.arange(t, device=device).expand(b, t)
        cos, sin = self.model.rotary(position_ids, inputs_embeds.dtype)
        write_idx = None
        if cache is None:
            k_pos = cache_positions
        else:
            if slots is None:
                raise ValueError("slots are required with a cache")
            kv_len = cache.capacity if kv_len is None else kv_len
            write_idx = torch.where(cache_positions >= 0, cache_positions, cache.capacity)
            k_pos = torch.arange(kv_len, device=device).expand(b, kv_len)
        # a padding token (cache position -1) attends to index 0 of its slot: a finite garbage output
        # instead of the NaN of an all-masked softmax row (NaN would reach the MoE router)
        q_pos = cache_positions if cache is None else cache_positions.clamp(min=0)
        lengths = mask = live = None
        if cache is not None:  # padding rows' experts are skipped (their output is garbage anyway)
            live = (cache_positions >= 0).reshape(-1)
        if cache is not None and self.kernels.applies(inputs_embeds) and (t == 1 or self._prefill_kernel):
            # the attention kernels read each row's slot in place, indices 0..position
            lengths = q_pos[:, 0] + 1 if t == 1 else q_pos + 1
        else:
            mask = causal_window_mask(q_pos, k_pos, None)
        run = range(len(self.model.layers)) if layers is None else layers

        def step(i, layer, x, h):
            kv = (cache.k[run[i]], cache.v[run[i]]) if cache is not None else None
            return layer(x, h, cos, sin, mask, kv, slots, write_idx, kv_len, lengths, image_mask, audio_mask, routing,
                         live)

        return prenorm_stack([self.model.layers[i] for i in run], inputs_embeds, lambda layer: layer.input_layernorm,
                             self.model.norm, step)

    def decode_reads_exact_lengths(self, device: torch.device | str) -> bool:
        """True when a one-token step on `device` reads each slot up to its own position (the fused
        attention kernel): `kv_len` is then ignored and one CUDA graph serves every length."""
        return self.kernels.on_device(device)


def load_thinker(checkpoint_dir: str | Path, *, dtype: torch.dtype = torch.float32, device="cpu",
                 tp: TPGroup = SINGLE, kernels: Kernels = REFERENCE, expert_dtype: str = "model") -> Thinker:
    """Build the thinker of a checkpoint folder on meta and load its `model.*` weights (strict)."""
    cfg = load_checkpoint_config(checkpoint_dir).thinker
    with torch.device("meta"):
        thinker = Thinker(cfg, tp, kernels=kernels, expert_dtype=expert_dtype)
    load_weights(thinker, read_weight_map(checkpoint_dir), prefix="model.", dtype=dtype, device=device, tp=tp,
                 what="thinker")
    return thinker.eval()
