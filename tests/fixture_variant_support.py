"""A second fixture set, built from the in-repo one: other dims, seed, shards and token ids.

`build_variant(source, out)` writes `out/ming_variant/` (plus the full-size manifest and config beside it, as
in tests/fixtures/) with the layout of tests/fixtures/README.md, but: the root weights in two shards
`model-0000{1,2}-of-00002.safetensors` named by the index; a thinker with 2 attention heads and 1 KV head and
other hidden / layer / expert counts; other vision, audio, talker, DiT, aggregator and VAE dims; other thinker
and talker special-token ids (and so another tokenizer placement, on which the random model's greedy replies
decode to control characters: tests/test_fixture_variant.py checks that); another weight seed, other case
inputs (ids, lengths, noise, latents, silence chunks) and another voice.

What this set is (docs/fidelity.md "The generated variant"): a check that the tests read every shape, id,
length and file name from the set under test. It is NOT a second parity check against the official code:
the expected outputs of the weight-dependent cases are computed by this project's own model code (which the
in-repo set checks against the official outputs), and the silence-holder outputs by `reference_silence_holder`
below, written from the reference's documented rules and checked against the in-repo set's official outputs
on every build. Inputs that do not depend on the weights (waveforms, mel features, images, pixel values,
resampler and fbank data, the voice wav, the segmenter and talker-text cases) are the in-repo set's own,
computed by the official code.

Run: `python tests/fixture_variant_support.py OUT` (prints the set's path; deterministic).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SEED = 16  # chosen so the random greedy replies to the engine tests' prompts hold no letter or digit
NAME = "ming_variant"
THINKER_EOS = 260  # <|role_end|>: every thinker special id moves with it (tiny_thinker_special_ids)
TALKER_BOS = 100  # talker <|endoftext|> (Qwen2 specials follow it)
TALKER_AUDIO = {"<audio>": 300, "<audioPatch>": 301}
VOICE = ("VAR_EN", "Good to see you again.")
SPEAK_TEXT = "The quick brown fox jumps over it."
LOOP_STEPS = 5
SHARDS = 2


def _dims(cfg: dict, talker: dict, talker_llm: dict, vae: dict, thinker_ids: dict, talker_ids: dict) -> None:
    """The variant's dims and ids, in place, on copies of the source configs."""
    llm = cfg["llm_config"]
    llm.update(vocab_size=576, hidden_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
               num_hidden_layers=3, first_k_dense_replace=2, intermediate_size=80, moe_intermediate_size=24,
               num_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, num_shared_experts=1,
               eos_token_id=thinker_ids["<|role_end|>"], pad_token_id=thinker_ids["<|endoftext|>"],
               image_patch_token=thinker_ids["<imagePatch>"], video_patch_token=thinker_ids["<framePatch>"],
               image_start_token=thinker_ids["<image>"], video_start_token=thinker_ids["</image>"])
    cfg["vision_config"].update(depth=3, hidden_size=48, num_heads=2, intermediate_size=80, out_hidden_size=80,
                                num_position_embeddings=36, deepstack_visual_indexes=[0, 2])
    cfg["audio_config"]["whisper_encoder_config"].update(n_ctx=200, n_state=48, n_head=2, n_layer=3)
    talker_llm.update(vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, bos_token_id=talker_ids["<|endoftext|>"],
                      eos_token_id=talker_ids["<|im_end|>"])
    talker["flowmodel"].update(hidden_size=48, depth=3, num_heads=2, mlp_ratio=2, llm_cond_dim=48)
    talker["aggregator"].update(hidden_size=40, depth=1, num_heads=2, mlp_ratio=2)
    vae["enc_kwargs"]["backbone"].update(hidden_size=24, intermediate_size=48, num_hidden_layers=4,
                                         num_attention_heads=2, num_key_value_heads=1, sliding_window=12)
    vae["dec_kwargs"]["backbone"].update(hidden_size=24, intermediate_size=40, num_hidden_layers=3,
                                         num_attention_heads=3, num_key_value_heads=1, sliding_window=16)


# ---- weights -------------------------------------------------------------------------------------
def _random_state(module: torch.nn.Module, keys: dict[str, tuple[int, ...]], gen: torch.Generator) -> dict:
    """Seeded values for checkpoint `keys` by the in-repo set's recipe (tests/fixtures/README.md): Linear/conv
    weights N(0, 1/fan_in), biases and expert biases N(0, 0.05²), norm weights 1 + N(0, 0.1²), embedding tables
    and CLS tokens N(0, 1), vision.pos_embed N(0, 0.5²); persistent buffers keep their computed values."""
    from realtime_ming.model.loader import materialize

    buffers = dict(materialize(module, "cpu", torch.float32).named_buffers())
    tables = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, torch.nn.Embedding)
              or type(m).__name__.endswith("Embedding")}
    out = {}
    for key, shape in sorted(keys.items()):
        if key in buffers:
            out[key] = buffers[key].detach().clone().float()
            continue
        x = torch.randn(shape, generator=gen)
        if key.endswith("pos_embed.weight"):
            x = 0.5 * x
        elif key in tables or key.endswith(("cls_embed", "word_embedder.weight", "embed_tokens.weight")):
            pass
        elif len(shape) >= 2:
            x = x / float(torch.tensor(shape[1:]).prod()) ** 0.5
        elif key.endswith("weight"):
            x = 1 + 0.1 * x
        else:
            x = 0.05 * x
        out[key] = x.contiguous()
    return out


def _write_weights(root: Path, gen: torch.Generator) -> None:
    from realtime_ming.model.config import load_checkpoint_config
    from realtime_ming.model.loader import checkpoint_keys
    from realtime_ming.model.ming import MingOmni
    from realtime_ming.model.talker import Talker
    from realtime_ming.model.vae import AudioVAE

    ck = load_checkpoint_config(root)
    with torch.device("meta"):
        ming, talker, vae = MingOmni(ck.ming), Talker(ck.talker), AudioVAE(ck.vae)
    tensors = _random_state(ming, checkpoint_keys(ming), gen)
    names = sorted(tensors)
    files = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    # contiguous halves of the sorted keys, so a layer can straddle the two files
    parts = [names[i * len(names) // SHARDS:(i + 1) * len(names) // SHARDS] for i in range(SHARDS)]
    for file, part in zip(files, parts):
        save_file({k: tensors[k] for k in part}, str(root / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {k: file for file, part in zip(files, parts) for k in part}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for module, path in ((talker, root / "talker" / "model.safetensors"),
                         (vae, root / "talker" / "vae" / "model.safetensors")):
        save_file(_random_state(module, checkpoint_keys(module), gen), str(path), metadata={"format": "pt"})


# ---- the reference's silence holder, from its documented rules -----------------------------------
def reference_silence_holder(chunks: list[torch.Tensor], rate: int = 44100) -> list[torch.Tensor]:
    """What `BailingTalker2.silence_holder` emits for each 1-D chunk (the last one ends the stream), as
    tests/fixtures/README.md and docs/fidelity.md describe it: 0.1 s frames, silent when mean |x| <= 1e-3; a
    partial frame waits for the next chunk (and is dropped at the end); an all-silent chunk is held; a chunk
    with loud frames emits the held audio and itself up to its last loud frame (+ 0.3 s on the last chunk),
    then holds the last `len(held)` samples of what it emitted (the reference's re-hold of its concatenated
    output); the last chunk, if silent or shorter than a frame, emits held + buffered audio cut to 0.3 s."""
    frame, tail = int(rate * 0.1), int(rate * 0.3)
    held, partial, out = torch.zeros(0), torch.zeros(0), []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        if chunk.numel() == 0:
            out.append(chunk)
            continue
        x = torch.cat((partial, chunk))
        whole = x.numel() // frame * frame
        x, partial = x[:whole], x[whole:]
        loud = [f for f in range(whole // frame) if x[f * frame:(f + 1) * frame].abs().mean() > 1e-3]
        if not loud:
            held = torch.cat((held, x))
            out.append(torch.cat((held, partial))[:tail] if last else torch.zeros(0))
            continue
        keep = (loud[-1] + 1) * frame + (tail if last else 0)
        emitted = torch.cat((held, x[:keep]))
        out.append(emitted)
        held = emitted[emitted.numel() - held.numel():] if held.numel() else torch.zeros(0)
    return out


def _check_silence_rules(source_cases: Path) -> None:
    t = load_file(str(source_cases / "vae_decode.safetensors"))
    n = sum(1 for k in t if k.startswith("silence_in_"))
    got = reference_silence_holder([t[f"silence_in_{i}"][0] for i in range(n)])
    for i, g in enumerate(got):
        if not torch.equal(g, t[f"silence_out_{i}"][0]):
            raise AssertionError(f"reference_silence_holder disagrees with the official silence_out_{i}")


def _silence_chunks(gen: torch.Generator, rate: int = 44100) -> list[torch.Tensor]:
    """Chunks that exercise the re-held tail across several loud chunks and a silent end."""
    frame = rate // 10

    def chunk(pattern: str, extra: int = 0) -> torch.Tensor:
        parts = [(0.3 if c == "L" else 2e-4) * torch.randn(frame, generator=gen) for c in pattern]
        return torch.cat(parts + [2e-4 * torch.randn(extra, generator=gen)])

    return [chunk("SS", 1234), chunk("LLS", 300), chunk("SLS"), chunk("SSS", 77), chunk("LS", 4000),
            chunk("L"), chunk("SSSSS", 999)]


# ---- cases ---------------------------------------------------------------------------------------
def _argmax_margin(logits: torch.Tensor) -> tuple[int, float]:
    top = logits.topk(2)
    return int(top.indices[0]), float(top.values[0] - top.values[1])


def _routes(thinker, embeds, positions, **masks) -> tuple[dict, float]:
    routing = []
    thinker(embeds, positions, routing=routing, **masks)
    out = {}
    for record in routing:
        ids, order = record.expert_ids[0].sort(-1)
        out[f"route_layer{record.layer}_expert_ids"] = ids
        out[f"route_layer{record.layer}_expert_weights"] = record.weights[0].gather(-1, order)
    return out, len(routing)


def _thinker_cases(root: Path, src: Path, cases: Path, media_tensors: dict, gen: torch.Generator) -> None:
    from realtime_ming.model.multimodal import (MediaTokenIds, get_t_scale_rope_index, router_masks,
                                                splice_embeddings, unwrap_audio)
    from realtime_ming.model.thinker import load_thinker
    from realtime_ming.model.tiny_tokenizer import tiny_thinker_special_ids

    special = tiny_thinker_special_ids(THINKER_EOS)
    media = MediaTokenIds.from_token_map(special)
    thinker = load_thinker(root)
    s = special

    def words(n):
        return torch.randint(20, 250, (n,), generator=gen).tolist()

    def run(ids: list[int], n_new: int, grid=None, image=None, audio=None, spans=()):
        def forward(seq):
            t = torch.tensor([seq])
            pos, deltas = get_t_scale_rope_index(t, media, grid)
            emb = splice_embeddings(thinker.embed(t), t, media, image_embeds=image,
                                    audio_clips=audio or (), audio_spans=spans)
            image_mask, audio_mask = router_masks(t, media, spans)
            masks = dict(image_mask=image_mask, audio_mask=audio_mask) if grid is not None else {}
            return t, pos, deltas, emb, masks, thinker(emb, pos, **masks)

        seq, greedy, margins = list(ids), [], []
        for _ in range(n_new):  # the reference's greedy continuation: full recompute per token
            tok, margin = _argmax_margin(thinker.logits(forward(seq)[-1])[0, -1])
            greedy.append(tok), margins.append(margin)
            seq.append(tok)
        if min(margins) < 1e-3:  # a near tie could flip between the cached and the recomputed path
            raise AssertionError(f"greedy top-1/top-2 margin {min(margins):.2g} too small: choose another seed")
        t, pos, deltas, emb, masks, hidden = forward(ids)
        routes, _ = _routes(thinker, emb, pos, **masks)
        out = dict(input_ids=t, position_ids=pos, logits=thinker.logits(hidden), greedy_ids=torch.tensor([greedy]),
                   **routes)
        return out, hidden, deltas, emb, masks, margins

    with torch.no_grad():
        ids = [s["<role>"], *words(6), s["</role>"], *words(9), s["<|role_end|>"], s["<role>"], *words(2), s["</role>"]]
        text, hidden, _, _, _, margins = run(ids, 6)
        text["final_hidden_state"] = hidden
        _save_case(src, cases, "thinker_text", text, {
            "special_ids_tiny": {k: special[k] for k in _source_meta(src, "thinker_text")["special_ids_tiny"]},
            "greedy": {"n_new_tokens": 6, "method": "recompute full sequence each step, argmax of last position",
                       "ids": text["greedy_ids"][0].tolist(), "top1_minus_top2_logit_margins": margins}})

        grid = media_tensors["image0_grid_thw"]
        image = media_tensors["image0_image_embeds"]
        audio_embeds, audio_lengths = media_tensors["audio_embeds"], media_tensors["audio_embeds_lengths"]
        n_audio = int(audio_lengths[0, 0])
        newline = 10  # "\n" (byte tokens fill the ids below the specials)
        ids = [s["<role>"], *words(4), s["</role>"], s["<image>"], *[s["<imagePatch>"]] * image.shape[0],
               s["</image>"], newline, *words(3), s["<audio>"]]
        spans = [[(len(ids), n_audio)]]
        ids += [s["<audioPatch>"]] * n_audio + [s["</audio>"], *words(2), s["<|role_end|>"], s["<role>"],
                                                 *words(2), s["</role>"]]
        clips = unwrap_audio(audio_embeds, audio_lengths)
        mm, _, deltas, emb, masks, margins = run(ids, 4, grid, image, clips, spans)
        mm.update(image_embeds=image, image_grid_thw=grid, audio_embeds=audio_embeds,
                  audio_embeds_lengths=audio_lengths, audio_placeholder_loc_lens=torch.tensor(spans),
                  inputs_embeds=emb, rope_deltas=deltas,
                  router_per_token=masks["image_mask"].long() + 2 * masks["audio_mask"].long())
        _save_case(src, cases, "thinker_multimodal", mm, {
            "special_ids_tiny": {k: special[k] for k in _source_meta(src, "thinker_multimodal")["special_ids_tiny"]},
            "greedy": {"n_new_tokens": 4, "ids_recompute": mm["greedy_ids"][0].tolist(), "margins": margins}})


def _tower_cases(root: Path, src: Path, cases: Path) -> dict:
    """vision and audio_frontend_and_encoder: the source inputs, outputs of this set's towers."""
    from realtime_ming.model.audio_encoder import AudioProjector, WhisperEncoder, encode_wrapped, unwrap_feats
    from realtime_ming.model.config import load_checkpoint_config
    from realtime_ming.model.loader import load_weights, read_weight_map
    from realtime_ming.model.vision import VisionProjector, VisionTransformer

    cfg = load_checkpoint_config(root).ming
    weights = read_weight_map(root)
    towers = {}
    for name, tower_cls, proj_cls, sub, prefix, proj_prefix in (
            ("vision", VisionTransformer, VisionProjector, cfg.vision_config, "vision.", "linear_proj."),
            ("audio", WhisperEncoder, AudioProjector, cfg.audio_config, "audio.", "linear_proj_audio.")):
        with torch.device("meta"):
            tower, proj = tower_cls(sub), proj_cls(sub, cfg.llm_config.hidden_size)
        towers[name] = (load_weights(tower, weights, prefix=prefix).eval(),
                        load_weights(proj, weights, prefix=proj_prefix).eval())
    vit, vproj = towers["vision"]
    enc, aproj = towers["audio"]
    v = load_file(str(src / "cases" / "vision.safetensors"))
    v = {k: x for k, x in v.items() if "_raw_" in k or "_resized_" in k or "pixel_values" in k or "grid_thw" in k}
    a = load_file(str(src / "cases" / "audio_frontend_and_encoder.safetensors"))
    keep = ("waveform", "mel", "mel_lengths", "encoder_feats_lengths", "audio_embeds_lengths", "resample_",
            "twoclip_mel", "twoclip_mel_lengths", "twoclip_waveform_b", "twoclip_audio_embeds_lengths")
    a = {k: x for k, x in a.items() if k.startswith(keep) and not k.endswith("audio_embeds")}
    n_images = len(_source_meta(src, "vision")["images"])
    with torch.no_grad():
        for i in range(n_images):
            out, deep = vit(v[f"image{i}_pixel_values"], v[f"image{i}_grid_thw"], return_deepstack=True)
            v[f"image{i}_vit_out"], v[f"image{i}_image_embeds"] = out, vproj(out)
            v.update({f"image{i}_deepstack{k}_out_discarded": d for k, d in enumerate(deep)})
        v["batched_image_embeds"] = vproj(vit(v["batched_pixel_values"], v["batched_grid_thw"]))
        a["whisper_encoder_out"] = enc(a["mel"])
        a["projector_out_prenorm"] = aproj.project(a["whisper_encoder_out"])
        a["audio_embeds"] = aproj(a["whisper_encoder_out"])
        a["twoclip_whisper_encoder_out_padded"] = enc(unwrap_feats(a["twoclip_mel"], a["twoclip_mel_lengths"])[0])
        a["twoclip_audio_embeds"] = encode_wrapped(enc, aproj, a["twoclip_mel"], a["twoclip_mel_lengths"]).embeds
    _save_case(src, cases, "vision", v, {})
    _save_case(src, cases, "audio_frontend_and_encoder", a, {})
    return {**v, **a}


def _talker_cases(root: Path, src: Path, cases: Path, gen: torch.Generator) -> None:
    from realtime_ming.model.cfm import CFMParams, sway
    from realtime_ming.model.config import load_checkpoint_config
    from realtime_ming.model.loader import load_weights, read_weight_map
    from realtime_ming.model.talker import generate, load_talker
    from realtime_ming.model.vae import AudioVAE
    from realtime_ming.model.vae_stream import VAEStreamState, decode_chunk

    ck = load_checkpoint_config(root)
    talker = load_talker(ck.talker, root / "talker" / "model.safetensors")
    with torch.device("meta"):
        vae = AudioVAE(ck.vae)
    vae = load_weights(vae, read_weight_map(root / "talker" / "vae" / "model.safetensors")).eval()
    p, latent = ck.talker.patch_size, talker.latent_dim
    hidden, steps, history = ck.talker.llm.hidden_size, ck.talker.steps, ck.talker.history_patch_size
    src_cfm = load_file(str(src / "cases" / "talker_cfm_step.safetensors"))
    rnd = lambda *shape: torch.randn(shape, generator=gen)  # noqa: E731
    with torch.no_grad():
        c = {k: src_cfm[k] for k in src_cfm if k.startswith("t_grid")}
        c.update(h=rnd(1, 1, hidden), his_lat=rnd(1, history, latent), y0=rnd(1, p, latent),
                 sde_rnd=rnd(steps, 1, p, latent))
        t = sway(c["t_grid_fp32"])
        for prefix, temperature in (("", 0.0), ("temp1_", 1.0)):
            y, states = talker.cfm.sample(c["h"], c["his_lat"], c["y0"], t, CFMParams(2.0, 0.25, temperature).tensor(),
                                          c["sde_rnd"], trajectory=True)
            c[f"{prefix}gen_lat"], c[f"{prefix}trajectory"] = y, states
        c["aggregator_embed"], c["stop_prob"] = talker.aggregator(c["gen_lat"]), talker.stop_probs(c["h"])
        ctx = talker.cfm.model.cfg_context(c["h"], c["his_lat"], t[:-1])
        c["dit_forward_with_cfg_step0"] = talker.cfm.model.forward_with_cfg(c["y0"], 0, ctx)
        bf = load_talker(ck.talker, root / "talker" / "model.safetensors", dtype=torch.bfloat16)
        c["bf16_informative_gen_lat"] = bf.cfm.sample(
            c["h"].bfloat16(), c["his_lat"].bfloat16(), c["y0"].bfloat16(), c["t_grid_bf16_after_sway"],
            CFMParams().tensor(dtype=torch.bfloat16), c["sde_rnd"].bfloat16())[0].float()
        c["sde_args"] = CFMParams().tensor()
        _save_case(src, cases, "talker_cfm_step", c, {})

        loop = _voice_and_prompt(root, src, talker, vae, gen, p)
        loop.update(t_grid=src_cfm["t_grid_fp32"], sde_args=CFMParams().tensor(),
                    noise_y0=rnd(LOOP_STEPS, 1, p, latent), noise_sde=rnd(LOOP_STEPS, steps, 1, p, latent))
        got = list(generate(talker, loop["inputs_embeds"], loop["prompt_wav_lat"], t_grid=sway(loop["t_grid"]),
                            max_steps=LOOP_STEPS, noise=lambda s: (loop["noise_y0"][s], loop["noise_sde"][s])))
        for attr, key in (("his_in", "his_lat_in"), ("hidden", "lm_last_hidden"), ("gen_lat", "gen_lat"),
                          ("next_embed", "next_embed"), ("stop_prob", "stop_prob")):
            loop[key] = torch.stack([getattr(s, attr) for s in got])
        meta = loop.pop("_meta")
        meta["loop"] = {**_source_meta(src, "talker_loop")["loop"], "K": LOOP_STEPS}
        _save_case(src, cases, "talker_loop", loop, meta)

        n_lat = 5 * p
        d = dict(latents=rnd(1, n_lat, latent))
        d["full_decode"] = vae.decode(d["latents"])[:, None]
        state, outs = VAEStreamState.allocate(vae, 1, p), []
        for i in range(n_lat // p):
            outs += decode_chunk(vae, d["latents"][:, i * p:(i + 1) * p], state, i == n_lat // p - 1).rows()
        d["stream_chunk_lengths"] = torch.tensor([o.numel() for o in outs])
        d["stream_decode_concat"] = torch.cat(outs)[None, None]
        n = 31000
        d["encode_waveform"] = 0.2 * torch.sin(torch.arange(n) * 0.031)[None] + 0.02 * rnd(1, n)
        post = vae.encode(d["encode_waveform"])
        d.update(encode_posterior_mean=post.mean, encode_posterior_std=post.std, encode_eps=rnd(*post.mean.shape))
        d["encode_latent_sample"] = post.sample(d["encode_eps"])
        d["encode_frame_num"] = torch.tensor([float(post.mean.shape[1])])
        chunks = _silence_chunks(gen)
        for i, (x, y) in enumerate(zip(chunks, reference_silence_holder(chunks))):
            d[f"silence_in_{i}"], d[f"silence_out_{i}"] = x[None], y[None]
        sliding = ck.vae.dec_kwargs.backbone.sliding_window
        _save_case(src, cases, "vae_decode", d, {"decoder_backbone_sliding_window": sliding, "stream": {
            **_source_meta(src, "vae_decode")["stream"], "chunk_lengths": d["stream_chunk_lengths"].tolist()}})


def _pseudo_encode(special: dict[str, int]):
    """Character-level stand-in for the talker tokenizer (only the ids matter): specials whole, each other
    character to an id below the special ids."""
    pattern = "(" + "|".join(re.escape(k) for k in sorted(special, key=len, reverse=True)) + ")"
    low = min(special.values())
    return lambda text: [special[part] if part in special else 1 + (ord(ch) * 37) % (low - 1)
                         for part in re.split(pattern, text) if part for ch in ([part] if part in special else part)]


def _voice_and_prompt(root, src, talker, vae, gen, p) -> dict:
    from realtime_ming.audio.fbank import FBANK_SAMPLE_RATE_HZ, speaker_fbank
    from realtime_ming.audio.resample import resample_torchaudio_compatible
    from realtime_ming.model.tiny_tokenizer import tiny_talker_special_ids
    import soundfile as sf

    name, prompt_text = VOICE
    wav_rel = json.loads((root / "talker" / "data" / "voice_name.json").read_text())[name]["prompt_wav_path"]
    wav, sr = sf.read(root / "talker" / wav_rel, dtype="float32")
    wave = torch.from_numpy(wav)[None]
    out = {"prompt_wave_44k": wave, "spk_vector_192": torch.randn(1, 192, generator=gen),
           "campplus_input_fbank": speaker_fbank(resample_torchaudio_compatible(torch.from_numpy(wav), sr,
                                                                                FBANK_SAMPLE_RATE_HZ))}
    out["prompt_wave_padded_bf16_rounded"] = vae.prompt_wave(wave, p)
    out["prompt_vae_eps"] = torch.randn(1, out["prompt_wave_padded_bf16_rounded"].shape[1] // vae.samples_per_latent,
                                        vae.cfg.enc_kwargs.latent_dim, generator=gen)
    post, lat = vae.encode_prompt(wave, p, eps=out["prompt_vae_eps"])
    out.update(prompt_vae_posterior_mean=post.mean, prompt_vae_posterior_std=post.std, prompt_wav_lat=lat)
    voice = talker.register_voice(out["spk_vector_192"], lat)
    out.update(spk_embed=voice.spk_embed, prompt_wav_emb=voice.prompt_emb)
    special = tiny_talker_special_ids(TALKER_BOS, TALKER_AUDIO)
    encode = _pseudo_encode(special)
    texts = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", "<|im_start|>user\n",
             "Please generate speech based on the following description.\n", "  speaker_1:", "<|vision_start|>",
             "<|vision_pad|>", "<|vision_end|>\n", " Text input:\n", prompt_text, SPEAK_TEXT, "<|im_end|>\n",
             "<|im_start|>assistant\n", "<audio>"] + ["<audioPatch>"] * voice.prompt_emb.shape[1]
    pieces = [{"text": x, "ids": encode(x)} for x in texts]
    ids = [i for piece in pieces for i in piece["ids"]]
    speaker = sum(len(x["ids"]) for x in pieces[:5])
    audio = sum(len(x["ids"]) for x in pieces[:13])
    out["input_ids"] = torch.tensor([ids])
    embeds = talker.model.embed_tokens(out["input_ids"]).clone()
    embeds[0, speaker] = voice.spk_embed[0]
    embeds[0, audio:audio + voice.prompt_emb.shape[1]] = voice.prompt_emb[0]
    out["inputs_embeds"] = embeds
    meta = _source_meta(src, "talker_loop")
    meta["voice"].update(name=name, prompt_text=prompt_text, wav=f"talker/{wav_rel}")
    meta["template"].update(pieces=pieces, speaker_embedding_position=speaker,
                            prompt_audio_positions=[audio, audio + voice.prompt_emb.shape[1]],
                            note="pieces tokenised separately by a character-level pseudo tokenizer; "
                                 f"special ids: {json.dumps(special)}")
    out["_meta"] = meta
    return out


# ---- files ---------------------------------------------------------------------------------------
def _source_meta(src: Path, name: str) -> dict:
    return json.loads((src / "cases" / f"{name}.json").read_text())


def _save_case(src: Path, cases: Path, name: str, tensors: dict, updates: dict) -> None:
    meta = _source_meta(src, name)
    meta.update(updates)
    meta["generated_by"] = "tests/fixture_variant_support.py (this project's model code; not the official code)"
    for key in [k for k in meta if k in ("fp64_crosscheck", "routing_stats", "sensitivity", "crosschecks", "bf16")]:
        meta.pop(key)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    meta["tensors"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                       for k, v in tensors.items()}
    (cases / f"{name}.json").write_text(json.dumps(meta, indent=1))
    save_file(tensors, str(cases / f"{name}.safetensors"))


def _write_configs(src: Path, root: Path) -> None:
    from realtime_ming.model.tiny_tokenizer import tiny_talker_special_ids, tiny_thinker_special_ids

    (root / "talker" / "llm").mkdir(parents=True)
    (root / "talker" / "vae").mkdir()
    (root / "talker" / "data" / "spks").mkdir(parents=True)
    read = lambda rel: json.loads((src / rel).read_text())  # noqa: E731
    cfg, talker, talker_llm, vae = (read("config.json"), read("talker/config.json"), read("talker/llm/config.json"),
                                    read("talker/vae/config.json"))
    _dims(cfg, talker, talker_llm, vae, tiny_thinker_special_ids(THINKER_EOS),
          tiny_talker_special_ids(TALKER_BOS, TALKER_AUDIO))
    for rel, data in (("config.json", cfg), ("talker/config.json", talker), ("talker/llm/config.json", talker_llm),
                      ("talker/vae/config.json", vae)):
        (root / rel).write_text(json.dumps(data, indent=2))
    shutil.copy(src / "preprocessor_config.json", root / "preprocessor_config.json")
    src_voice = next(iter(read("talker/data/voice_name.json").values()))
    wav = "data/spks/var_en_prompt.wav"
    shutil.copy(src / "talker" / src_voice["prompt_wav_path"], root / "talker" / wav)
    voices = {VOICE[0]: {"prompt_text": VOICE[1], "prompt_wav_path": wav}}
    (root / "talker" / "data" / "voice_name.json").write_text(json.dumps(voices, indent=2))


def build_variant(source: Path, out: Path, seed: int = SEED) -> Path:
    """Write the variant set under `out` (created; must not hold one already); returns its root."""
    source, out = Path(source).resolve(), Path(out)
    root = out / NAME
    _check_silence_rules(source / "cases")
    root.mkdir(parents=True)
    for extra in source.parent.glob("ming_flash_omni_2_0_*.json"):  # the full-size files the tests read beside
        shutil.copy(extra, out / extra.name)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    _write_configs(source, root)
    _write_weights(root, gen)
    cases = root / "cases"
    cases.mkdir()
    for name in ("segmenter", "talker_text_front"):  # weight-independent: the official outputs as they are
        shutil.copy(source / "cases" / f"{name}.json", cases / f"{name}.json")
    media = _tower_cases(root, source, cases)
    _thinker_cases(root, source, cases, media, gen)
    _talker_cases(root, source, cases, gen)
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/fixture_variant_support.py OUT_DIR")
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))
    print(build_variant(here / "fixtures" / "ming_tiny", Path(sys.argv[1])))
