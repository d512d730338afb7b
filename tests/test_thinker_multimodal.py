"""Multimodal thinker inputs against the `thinker_multimodal` golden case: prompt layout, 3-D positions,
splice, MultiRouter masks, logits/routing and greedy decode with the KV cache."""

from __future__ import annotations

import pytest
import torch

from realtime_ming.model.multimodal import (
    AudioInput,
    ImageInput,
    MediaKind,
    MediaTokenIds,
    MultimodalPrompt,
    PromptBuilder,
    VideoInput,
    get_t_scale_rope_index,
    prepare_prefill,
    rope_index_3d,
    router_masks,
    splice_embeddings,
    unwrap_audio,
)
from realtime_ming.model.thinker import ThinkerKVCache, load_thinker

from thinker_decode_support import greedy_decode, prefill

ATOL = RTOL = 1e-4


@pytest.fixture(scope="module")
def thinker(fixture_root):
    return load_thinker(fixture_root)


@pytest.fixture(scope="module")
def case(load_case):
    tensors, meta = load_case("thinker_multimodal")
    return tensors, meta, MediaTokenIds.from_token_map(meta["special_ids_tiny"])


def _spliced(thinker, tensors, media):
    ids = tensors["input_ids"]
    spans = tensors["audio_placeholder_loc_lens"].tolist()
    clips = unwrap_audio(tensors["audio_embeds"], tensors["audio_embeds_lengths"])
    embeds = splice_embeddings(thinker.embed(ids), ids, media, image_embeds=tensors["image_embeds"],
                               audio_clips=clips, audio_spans=spans)
    return embeds, router_masks(ids, media, spans)


def _fixture_prompt(tensors, media, special):
    """Rebuild the case's prompt with PromptBuilder from its own ids: the case's special ids stay specials,
    each `<image>`…`</image>` run becomes an image of the next `image_grid_thw` row (its newline is the id
    after `</image>`), each `<audio>`…`</audio>` run an audio clip of its `audio_placeholder_loc_lens`
    length; the ordinary ids between them are text, written as numbers for a stand-in encoder."""
    ids = tensors["input_ids"][0].tolist()
    grids = [tuple(g) for g in tensors["image_grid_thw"].tolist()]
    audio_lengths = [n for _, n in tensors["audio_placeholder_loc_lens"][0].tolist()]
    specials = set(special.values())
    newline = []

    def numbers(text: str) -> list[int]:
        return [newline[0] if x == "\n" else int(x) for x in text.replace("\n", " \n ").split(" ") if x.strip(" ")]

    b, run, i = PromptBuilder(numbers, media), [], 0

    def flush():
        if run:
            b.text(" ".join(map(str, run)) + " ")
            run.clear()

    while i < len(ids):
        tid = ids[i]
        if tid == media.image_start:
            flush()
            end = ids.index(media.image_end, i)
            newline[:] = [ids[end + 1]]
            b.image(ImageInput(grids.pop(0)))
            i = end + 2
        elif tid == media.audio_start:
            flush()
            b.audio(AudioInput(audio_lengths.pop(0)))
            i = ids.index(media.audio_end, i) + 1
        elif tid in specials:
            flush()
            b.special(tid)
            i += 1
        else:
            run.append(tid)
            i += 1
    flush()
    assert not grids and not audio_lengths, "the case's media do not match its prompt"
    return b.build()


def test_fixture_prompt_builder_reproduces_layout(case):
    """PromptBuilder yields the fixture ids, image grid and audio (start, length) exactly."""
    tensors, meta, media = case
    prompt = _fixture_prompt(tensors, media, meta["special_ids_tiny"])
    assert list(prompt.input_ids) == tensors["input_ids"][0].tolist()
    assert prompt.image_grid_thw == [tuple(g) for g in tensors["image_grid_thw"].tolist()]
    assert prompt.audio_placeholder_loc_lens == [tuple(x) for x in tensors["audio_placeholder_loc_lens"][0].tolist()]


def test_fixture_thinker_multimodal_positions(case):
    """3-D positions and rope delta from get_t_scale_rope_index equal the fixture exactly."""
    tensors, _, media = case
    pos, deltas = get_t_scale_rope_index(tensors["input_ids"], media, tensors["image_grid_thw"])
    assert torch.equal(pos, tensors["position_ids"])
    assert torch.equal(deltas, tensors["rope_deltas"])


def test_fixture_thinker_multimodal_splice_and_router(case, thinker):
    """Spliced inputs_embeds equal the fixture's; router masks give its per-token gate choice."""
    tensors, _, media = case
    with torch.no_grad():
        embeds, (image_mask, audio_mask) = _spliced(thinker, tensors, media)
    torch.testing.assert_close(embeds, tensors["inputs_embeds"], rtol=0, atol=1e-6)
    assert torch.equal(image_mask.long() + 2 * audio_mask.long(), tensors["router_per_token"])


def test_fixture_thinker_multimodal_logits_and_routing(case, thinker):
    """Prefill logits (rtol/atol 1e-4) and every layer's experts (exact) match the official model."""
    tensors, _, media = case
    routing = []
    with torch.no_grad():
        embeds, (image_mask, audio_mask) = _spliced(thinker, tensors, media)
        hidden = thinker(embeds, tensors["position_ids"], image_mask=image_mask, audio_mask=audio_mask,
                         routing=routing)
        torch.testing.assert_close(thinker.logits(hidden), tensors["logits"], rtol=RTOL, atol=ATOL)
    for record in routing:
        ids, order = record.expert_ids[0].sort(-1)
        assert torch.equal(ids, tensors[f"route_layer{record.layer}_expert_ids"])
        torch.testing.assert_close(record.weights[0].gather(-1, order),
                                   tensors[f"route_layer{record.layer}_expert_weights"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split_at", [None, 0.4])
def test_fixture_thinker_multimodal_greedy_kv_cache(case, thinker, split_at):
    """prepare_prefill + cached decode at cache position + rope delta reproduce the greedy ids."""
    tensors, meta, media = case
    prompt = _fixture_prompt(tensors, media, meta["special_ids_tiny"])
    clips = unwrap_audio(tensors["audio_embeds"], tensors["audio_embeds_lengths"])[0]
    expected = tensors["greedy_ids"]
    t = len(prompt.input_ids)
    splits = () if split_at is None else (int(t * split_at),)
    cache = ThinkerKVCache.allocate(thinker.cfg, 2, t + expected.shape[1] + 1)
    with torch.no_grad():
        inp = prepare_prefill(thinker.embed, prompt, media, image_embeds=tensors["image_embeds"], audio_clips=clips)
        assert inp.rope_delta == tensors["rope_deltas"].item()
        logits = prefill(thinker, cache, 1, inp.inputs_embeds, inp.position_ids, inp.cache_positions, splits,
                         image_mask=inp.image_mask, audio_mask=inp.audio_mask)
        out = greedy_decode(thinker, cache, torch.tensor([1]), logits.argmax(-1), torch.tensor([t]),
                            torch.tensor([inp.rope_delta]), expected.shape[1])
    assert torch.equal(out, expected)


def test_rope_index_worked_example(case):
    """docs/model.md §1.5 example: 2 text, <image>, 4×6 patches, </image>, 2 text -> documented rows, delta −5."""
    _, _, m = case
    ids = [1, 2, m.image_start] + [m.image_patch] * 6 + [m.image_end, 3, 4]
    pos, nxt = rope_index_3d(ids, m, [(1, 4, 6)])
    assert pos.tolist() == [[0, 1, 2, 3, 3, 3, 3, 3, 3, 4, 5, 6],
                            [0, 1, 2, 3, 3, 3, 4, 4, 4, 4, 5, 6],
                            [0, 1, 2, 2, 3, 4, 2, 3, 4, 4, 5, 6]]
    assert nxt - len(ids) == -5


def test_rope_index_continues_across_turns(case):
    """Positions of a prompt tail computed from the head's next position equal the whole prompt's."""
    tensors, meta, media = case
    prompt = _fixture_prompt(tensors, media, meta["special_ids_tiny"])
    whole, _ = rope_index_3d(prompt.input_ids, media, prompt.image_grid_thw)
    cut = prompt.spans[0].start + prompt.spans[0].length + 1  # after </image>
    head = MultimodalPrompt(prompt.input_ids[:cut], prompt.spans[:1])
    tail = prompt.tail(cut)
    head_pos, nxt = rope_index_3d(head.input_ids, media, head.image_grid_thw)
    tail_pos, _ = rope_index_3d(tail.input_ids, media, tail.image_grid_thw, start=nxt)
    assert torch.equal(torch.cat([head_pos, tail_pos], dim=1), whole)
    assert tail.audio_placeholder_loc_lens == [(s - cut, n) for s, n in prompt.audio_placeholder_loc_lens]
    with pytest.raises(ValueError, match="splits the image placeholder"):
        prompt.tail(prompt.spans[0].start + 1)


def test_splice_count_mismatch_raises(case, thinker):
    """Fewer image embedding rows than <imagePatch> positions is a ValueError naming both counts."""
    tensors, _, media = case
    ids = tensors["input_ids"]
    n = int((ids == media.image_patch).sum())
    with pytest.raises(ValueError, match=f"{n} <imagePatch> positions but {n - 1} embedding rows"):
        splice_embeddings(thinker.embed(ids), ids, media, image_embeds=tensors["image_embeds"][:n - 1])


def test_rope_index_grid_mismatch_raises(case):
    """A placeholder run shorter than its grid needs is a ValueError."""
    _, _, m = case
    with pytest.raises(ValueError, match="needs 6 placeholder tokens, found a run of 5"):
        rope_index_3d([m.image_start] + [m.image_patch] * 5 + [m.image_end], m, [(1, 4, 6)])


def test_video_prompt_interleaves_frames(case):
    """A video expands to <video>, per frame '<ts seconds>' + an <image> block of <framePatch>, </video>, newline."""
    _, _, m = case
    b = PromptBuilder(lambda s: [ord(c) for c in s], m)
    prompt = b.video(VideoInput((4, 4), (0.0, 0.5))).build()
    frame = [m.image_start] + [m.frame_patch] * 4 + [m.image_end]
    ts = lambda s: [ord(c) for c in s]  # noqa: E731
    assert list(prompt.input_ids) == [m.video_start, *ts("<0.0 seconds>"), *frame, *ts("<0.5 seconds>"), *frame,
                                      m.video_end, ord("\n")]
    assert [s.kind for s in prompt.spans] == [MediaKind.VIDEO_FRAME] * 2
    assert prompt.video_grid_thw == [(1, 4, 4), (1, 4, 4)]
    pos, _ = rope_index_3d(prompt.input_ids, m, video_grid_thw=prompt.video_grid_thw)
    first = prompt.spans[0].start
    assert pos[:, first:first + 4].tolist() == [[first] * 4, [first, first, first + 1, first + 1],
                                                 [first, first + 1, first, first + 1]]
