"""Thinker decode helpers on the fixture checkpoint: chunked prefill, cached greedy decode, and the mixed step
compared with decode and prefill apart."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from realtime_ming.engine.thinker_mixed import MIXED_FIELDS, pack_mixed
from realtime_ming.model.multimodal import PrefillInputs
from realtime_ming.model.rope3d import text_position_ids
from realtime_ming.model.thinker import ThinkerKVCache


def prefill(thinker, cache, slot, embeds, position_ids, cache_positions, splits=(), **masks):
    """Feed one slot's prompt in chunks cut at `splits`; returns the last position's logits [1, V]."""
    bounds = [0, *splits, embeds.shape[1]]
    slots = torch.tensor([slot], device=embeds.device)
    for a, b in zip(bounds, bounds[1:]):
        chunk_masks = {k: v[:, a:b] for k, v in masks.items() if v is not None}
        h = thinker(embeds[:, a:b], position_ids[:, :, a:b], cache=cache, slots=slots,
                    cache_positions=cache_positions[:, a:b], **chunk_masks)
    return thinker.logits(h[:, -1])


def greedy_decode(thinker, cache, slots, first, next_pos, rope_deltas, n):
    """Greedy tokens [B, n] by single-token cached decode; `first` [B] is already chosen."""
    tokens, out, pos = first, [first], next_pos.clone()
    for _ in range(n - 1):
        cp = pos[:, None]
        h = thinker(thinker.embed(tokens[:, None]), text_position_ids(cp, rope_deltas), cache=cache,
                    slots=slots, cache_positions=cp)
        tokens = thinker.logits(h[:, -1]).argmax(-1)
        out.append(tokens)
        pos += 1
    return torch.stack(out, dim=1)


def _text_greedy(thinker, ids, splits=(), n=8, cache=None, slot=0):
    t = ids.shape[1]
    cache = cache or ThinkerKVCache.allocate(thinker.cfg, 1, t + n + 1)
    pos = torch.arange(t)[None]
    with torch.no_grad():
        logits = prefill(thinker, cache, slot, thinker.embed(ids), pos.expand(3, 1, t), pos, splits)
        return greedy_decode(thinker, cache, torch.tensor([slot]), logits.argmax(-1), torch.tensor([t]),
                             torch.zeros(1, dtype=torch.int64), n)


def _prompt(model, ids: list[int], start: int, delta: int, audio: slice | None = None, device="cpu") -> PrefillInputs:
    """A prompt tail at cache positions start.., rotary positions shifted by `delta` (as after media), with an
    audio-routed span if given."""
    n = len(ids)
    cpos = torch.arange(start, start + n, device=device)[None]
    mask = None
    if audio is not None:
        mask = torch.zeros(1, n, dtype=torch.bool, device=device)
        mask[0, audio] = True
    return PrefillInputs(model.embed(torch.tensor([ids], device=device)), (cpos + delta)[None].expand(3, 1, n).clone(), cpos,
                         None, mask, delta)


def _row(slot: int, ids: list[int], next_token=None, delta=0, prefill=None):
    return SimpleNamespace(slot=SimpleNamespace(index=slot, ids=list(ids)), next_token=next_token, rope_delta=delta,
                           prefill=prefill)


@torch.no_grad()
def mixed_equals_apart(model, make_mixer, capacity: int, device="cpu", tol: float = 1e-4):
    """Slot 0 decodes (10 cached tokens, rotary delta 3), slot 1 prefills a whole 12-token prompt with an audio span,
    slot 2 the first 5 tokens of a prompt after 4 cached ones: the mixed step's logits and K/V equal the separate
    forwards' (the reference path: plain forwards over a copy of the cache)."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    a, b, c = (torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (10, 12, 9))
    dev = torch.device(device)
    ref = ThinkerKVCache.allocate(model.cfg, 4, capacity, tp=model.tp, device=dev, dtype=model.lm_head.weight.dtype)
    for slot, ids, delta in ((0, a, 3), (2, c[:4], 0)):  # cached history of the decoding row and the partial prompt
        p = _prompt(model, ids, 0, delta, device=dev)
        model(p.inputs_embeds, p.position_ids, cache=ref, slots=torch.tensor([slot], device=dev),
              cache_positions=p.cache_positions)
    mixed = ThinkerKVCache(ref.k.clone(), ref.v.clone())
    # apart: the decode row, then each prompt's chunk, each its own forward
    dec = _row(0, a, next_token=int(torch.randint(0, vocab, (1,), generator=gen)), delta=3)
    pos = torch.tensor([[len(a)]], device=dev)
    want_dec = model.logits(model(model.embed(torch.tensor([[dec.next_token]], device=dev)),
                                  (pos + 3)[None].expand(3, 1, 1), cache=ref, slots=torch.tensor([0], device=dev),
                                  cache_positions=pos)[:, -1])
    p1, p2 = _prompt(model, b, 0, 0, audio=slice(3, 8), device=dev), _prompt(model, c[4:], 4, 0, device=dev)
    want_b = model.logits(model(p1.inputs_embeds, p1.position_ids, cache=ref, slots=torch.tensor([1], device=dev),
                                cache_positions=p1.cache_positions, audio_mask=p1.audio_mask)[:, -1])
    model(p2.inputs_embeds[:, :2], p2.position_ids[:, :, :2], cache=ref, slots=torch.tensor([2], device=dev),
          cache_positions=p2.cache_positions[:, :2])
    # mixed: one forward; slot 2's chunk is its next 2 tokens only (a prompt the chunk does not complete)
    chosen = [(_row(1, [], prefill=p1), 0, 12), (_row(2, c[:4], prefill=p2), 0, 2)]
    needed, ints, embeds, last = pack_mixed([dec], chosen, device=dev, dtype=model.lm_head.weight.dtype,
                                            hidden=model.cfg.hidden_size)
    assert ints.shape == (len(MIXED_FIELDS), 1 + 12 + 2) and embeds.shape == (15, model.cfg.hidden_size)
    assert last == [12, 14] and needed == 12  # slot 1 fills positions 0..11
    mixer = make_mixer(mixed)
    got = mixer.step(needed, ints, embeds, torch.tensor([last[0], 0], device=dev))
    torch.testing.assert_close(got[0], want_b[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1], want_dec[0], rtol=tol, atol=tol)
    written = [(0, len(a) + 1), (1, 12), (2, 6)]
    for slot, n in written:
        torch.testing.assert_close(mixed.k[:, slot, :, :n], ref.k[:, slot, :, :n], rtol=tol / 10, atol=tol / 10)
        torch.testing.assert_close(mixed.v[:, slot, :, :n], ref.v[:, slot, :, :n], rtol=tol / 10, atol=tol / 10)
    return mixer
    assert not mixed.k[:, 3].any()  # padding and sink writes stay out of other slots
