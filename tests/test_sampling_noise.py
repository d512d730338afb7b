"""The sampler's exponential noise (`engine/sampling.py`): each row drawn in place from its own generator gives the
draws a fresh tensor per row gives, so sampled tokens do not depend on the batch around a row (issue 45)."""

from __future__ import annotations

import torch

from realtime_ming.engine.sampling import SamplingBatch, _exponential_noise, sample


def _seeded(seeds: list[int | None]) -> list[torch.Generator | None]:
    return [None if s is None else torch.Generator().manual_seed(s) for s in seeds]


def test_each_rows_noise_is_its_generators_fresh_draw():
    vocab, seeds = 1000, [3, None, 7, 3, 11]
    batch = SamplingBatch([1.0, 0.0, 0.7, 1.0, 1.3], [1.0] * 5, [0] * 5, _seeded(seeds), "cpu")
    noise = _exponential_noise(batch, (len(seeds), vocab), "cpu")
    for row, seed in zip(noise, seeds):
        want = torch.ones(vocab) if seed is None else \
            torch.empty(vocab).exponential_(generator=torch.Generator().manual_seed(seed))
        assert torch.equal(row, want)


def test_a_rows_sampled_tokens_are_those_it_samples_alone():
    """Step after step, a seeded row samples the tokens it samples in a batch of one (its generator alone)."""
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(4, 500, generator=gen) for _ in range(6)]
    temps, tops, ks, seeds = [0.9, 0.0, 1.2, 0.8], [0.95, 1.0, 0.8, 1.0], [0, 0, 40, 5], [1, None, 2, 3]
    together = _seeded(seeds)
    alone = [_seeded([s]) for s in seeds]
    for step in logits:
        got = sample(step, SamplingBatch(temps, tops, ks, together, "cpu"))
        for i in range(4):
            one = sample(step[i:i + 1], SamplingBatch(temps[i:i + 1], tops[i:i + 1], ks[i:i + 1], alone[i], "cpu"))
            assert int(got[i]) == int(one[0])
