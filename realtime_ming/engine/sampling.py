"""Batched, host-sync-free token sampling (greedy, temperature, top-k, top-p) with per-row seeds."""

from __future__ import annotations

import torch

from .graphs import upload

__all__ = ["SamplingBatch", "mask_to_allowed", "sample"]


class SamplingBatch:
    """Per-row sampling parameters as device tensors, plus one seeded generator per sampled row.

    Greedy rows (temperature 0) never touch a generator, so they are reproducible regardless
    of their neighbours in the batch.
    """

    def __init__(self, temperatures, top_ps, top_ks, generators, device):
        self.all_greedy = all(t == 0 for t in temperatures)
        self.generators = generators  # list[torch.Generator | None], None for greedy rows
        if self.all_greedy:  # argmax only: nothing to upload
            return
        self.temperature = upload(temperatures, torch.float32, device)  # [B]
        self.top_p = upload(top_ps, torch.float32, device)  # [B]
        self.top_k = upload(top_ks, torch.int64, device)  # [B], 0 = off


def _exponential_noise(batch: SamplingBatch, shape, device) -> torch.Tensor:
    """Exp(1) noise [B, V], row i drawn from row i's generator (ones for a greedy row), each row drawn in place:
    a contiguous row takes the same draws as a fresh tensor of its size, without B allocations and a stack."""
    noise = torch.empty(shape, device=device)
    for row, gen in zip(noise, batch.generators):
        if gen is None:
            row.fill_(1.0)
        else:
            row.exponential_(generator=gen)
    return noise


def mask_to_allowed(logits: torch.Tensor, allowed: list[tuple[int, ...] | None]) -> torch.Tensor:
    """Logits [B, V] with every token but row i's `allowed[i]` set to -inf (constrained decoding); a row
    whose entry is None is left as is. Returns `logits` itself when no row is constrained."""
    if all(a is None for a in allowed):
        return logits
    keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    for i, ids in enumerate(allowed):
        if ids is not None:
            keep[i] = False
            keep[i, upload(list(ids), torch.int64, logits.device)] = True
    return logits.masked_fill(~keep, float("-inf"))


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row from logits [B, V] (any float dtype) -> [B] int64 on the same device.

    Sampling divides probabilities by exponential noise and takes the argmax (the gpt-fast
    trick), which equals a multinomial draw without a host sync.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy
    temp = batch.temperature.clamp(min=1e-5)[:, None]
    scaled = logits / temp
    vocab = scaled.shape[-1]
    k = torch.where(batch.top_k > 0, batch.top_k.clamp(max=vocab), torch.full_like(batch.top_k, vocab))
    sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None]
    drop = ranks >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    cum = probs.cumsum(dim=-1) - probs  # mass strictly before each token
    drop |= cum > batch.top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(scaled, float("-inf")).scatter(-1, sorted_idx, sorted_logits)
    probs = filtered.softmax(dim=-1)
    noise = _exponential_noise(batch, probs.shape, probs.device)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(batch.temperature > 0, sampled, greedy)
