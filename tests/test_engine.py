"""Engine behaviour on CPU with the fixture checkpoint (issue 3): streamed output equals the offline model path,
batching and speculation change nothing, cancels and discards leak nothing, a session's prefix is reused and a
failing turn leaves its neighbours alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    AudioChunk,
    Content,
    ContentKind,
    FailureCode,
    FinishReason,
    Message,
    SamplingParams,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import TalkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.talker_runner import TalkerRunner, stream_seed
from realtime_ming.model.multimodal import AudioInput, ImageInput
from realtime_ming.model.talker import DEFAULT_MIN_NEW_TOKEN, build_talker_prompt, duration_step_cap, generate
from realtime_ming.model.talker_text import talker_job_texts
from realtime_ming.model.tokenizer import ChatMessage
from engine_support import (
    _assert_same_output, _CancelAt, _config, _done_fields, PROMPT_A, PROMPT_B, Recorder, _request, _run, _TERMINAL,
    _wait_stats,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def bundle(fixture_root) -> ModelBundle:
    return ModelBundle.load(_config(fixture_root))


@pytest.fixture
def make_engine(fixture_root, bundle):
    """Engines over the module's bundle (a fresh thread and fresh caches each); closed after the test."""
    engines = []

    def make(engine: dict | None = None, hooks: EngineHooks | None = None, **thinker) -> Engine:
        engines.append(Engine(_config(fixture_root, engine, **thinker), bundle if hooks is None else bundle.with_hooks(hooks)))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


def _assert_identical(a: Recorder, b: Recorder) -> None:
    """Same text deltas, bit-identical audio chunks, same usage (turn ids and timestamps aside)."""
    oa, ob = a.outputs(), b.outputs()
    assert [type(e) for e in oa] == [type(e) for e in ob]
    for x, y in zip(oa, ob):
        if isinstance(x, TextDelta):
            assert x.text == y.text
        elif isinstance(x, AudioChunk):
            assert x.segment_id == y.segment_id and np.array_equal(x.pcm, y.pcm)
        else:
            assert _done_fields(x) == _done_fields(y)


def _close_all(engine: Engine, conversations) -> None:
    for conversation in conversations:
        engine.close_conversation(conversation)


# ---- thinker -------------------------------------------------------------------------------------------


@torch.no_grad()
def _greedy_reference(bundle: ModelBundle, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy decode by full recompute over the whole sequence (no KV cache, no runner)."""
    ids, out = list(prompt_ids), []
    thinker = bundle.thinker
    for _ in range(max_tokens):
        x = torch.tensor([ids])
        pos = torch.arange(len(ids))[None, None].expand(3, 1, -1)  # text: t = h = w = index
        token = int(thinker.logits(thinker(thinker.embed(x), pos)[:, -1]).argmax(-1))
        if token == bundle.tokenizer.eos_id:
            break
        out.append(token)
        ids.append(token)
    return out


@pytest.mark.parametrize("prompt,max_tokens", [(PROMPT_A, 20), (PROMPT_B, 8)])
def test_engine_streamed_text_equals_greedy_recompute(make_engine, bundle, prompt, max_tokens):
    """Concatenated TextDeltas and the token count equal a cache-free greedy decode of the same prompt ids."""
    engine = make_engine()
    rec = _run(engine, _request("t", prompt, max_tokens=max_tokens, ignore_eos=False, with_audio=False))
    done = rec.events[-1]
    prompt_ids = list(bundle.tokenizer.build_prompt([ChatMessage("user", (prompt,))]).input_ids)
    ref = _greedy_reference(bundle, prompt_ids, max_tokens)
    assert isinstance(done, TurnDone)
    assert rec.text() == done.text == bundle.tokenizer.decode(ref)
    assert done.output_tokens == len(ref)
    assert done.prompt_tokens == len(prompt_ids) and done.cached_tokens == 0
    assert done.finish_reason == (FinishReason.LENGTH if len(ref) == max_tokens else FinishReason.STOP)


def test_engine_second_turn_prefills_only_new_tokens(make_engine, bundle):
    """Turn 2 of a conversation reuses turn 1's cached prompt + reply; it prefills only the tokens after them."""
    reply = "Sure, here is a short answer."
    reply_ids = bundle.tokenizer.encode(reply)
    engine = make_engine(hooks=EngineHooks(forced_reply=reply))
    first = _run(engine, _request("t1", PROMPT_A, conversation="c", max_tokens=len(reply_ids), with_audio=False))
    history = (Message("user", (Content.of_text(PROMPT_A),)), Message("assistant", (Content.of_text(reply),)))
    second = _run(engine, _request("t2", PROMPT_B, conversation="c", history=history, with_audio=False))
    tok = bundle.tokenizer
    prompt1 = list(tok.build_prompt([ChatMessage("user", (PROMPT_A,))]).input_ids)
    prompt2 = list(tok.build_prompt([ChatMessage("user", (PROMPT_A,)), ChatMessage("assistant", (reply,)),
                                     ChatMessage("user", (PROMPT_B,))]).input_ids)
    assert first.text() == reply
    assert prompt2[:len(prompt1) + len(reply_ids)] == prompt1 + reply_ids
    d1, d2 = first.events[-1], second.events[-1]
    assert (d1.prompt_tokens, d1.cached_tokens) == (len(prompt1), 0)
    # the cache holds the prompt and every reply token but the last sampled one, which was never fed back
    assert d2.prompt_tokens == len(prompt2)
    assert d2.cached_tokens == len(prompt1) + len(reply_ids) - 1
    assert d2.prompt_tokens - d2.cached_tokens == len(prompt2) - len(prompt1) - len(reply_ids) + 1


def _media_turn(bundle: ModelBundle, kind: str):
    rng = np.random.default_rng(3)
    if kind == "image":
        image = rng.integers(0, 256, (56, 72, 3), dtype=np.uint8)
        grid = tuple(int(v) for v in bundle.vision_input(image).grid_thw)
        return (Content.of_image(image), Content.of_text("What is in the picture?")), \
            (ImageInput(grid), "What is in the picture?")
    wave = (0.1 * rng.standard_normal(12000)).astype(np.float32)  # 0.5 s at 24 kHz: resampled to 8000 samples
    return (Content.of_audio(wave, 24000),), (AudioInput(bundle.audio_tokens(8000)),)


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_engine_media_turn_completes(make_engine, bundle, kind):
    """A turn with image or audio content ends in TurnDone with text; its prompt holds the media's tokens."""
    engine = make_engine()
    content, items = _media_turn(bundle, kind)
    request = TurnRequest("m", "m", (Message("user", content),), sampling=SamplingParams(max_tokens=8, ignore_eos=True),
                          with_audio=False)
    rec = _run(engine, request)
    done = rec.events[-1]
    assert isinstance(done, TurnDone)
    assert done.output_tokens == 8 and done.text != "" and rec.text() == done.text
    assert done.prompt_tokens == len(bundle.tokenizer.build_prompt([ChatMessage("user", items)]).input_ids)


def test_engine_video_turn_completes(make_engine):
    """A turn with sampled video frames ends in TurnDone with text."""
    engine = make_engine()
    frames = np.random.default_rng(4).integers(0, 256, (4, 56, 56, 3), dtype=np.uint8)
    video = Content(ContentKind.VIDEO, video=frames, fps=2.0)
    request = TurnRequest("v", "v", (Message("user", (video, Content.of_text("What happens?"))),),
                          sampling=SamplingParams(max_tokens=8, ignore_eos=True), with_audio=False)
    done = _run(engine, request).events[-1]
    assert isinstance(done, TurnDone) and done.output_tokens == 8 and done.text != ""


# ---- talker and VAE -----------------------------------------------------------------------------------


@torch.no_grad()
def _offline_speech(bundle: ModelBundle, text: str, turn_seed: int, max_prompt_len: int, min_new_token: int) -> np.ndarray:
    """The non-streamed path: every talker job of `text` by the reference loop, then one full VAE decode each."""
    voice, prompt_text = bundle.voices[bundle.default_voice]
    tok = bundle.talker_tokenizer
    seconds_per_step = bundle.cfg.talker.patch_size * bundle.vae.samples_per_latent / bundle.vae.cfg.sample_rate
    out = []
    for index, job_text in enumerate(talker_job_texts(text)):
        prompt = build_talker_prompt(lambda s: tok.encode(s, add_special_tokens=False).ids, bundle.talker_special,
                                     job_text, num_speakers=0 if voice.spk_embed is None else 1,
                                     prompt_text=prompt_text if voice.num_patches else None,
                                     prompt_patches=voice.num_patches)
        spk = [] if voice.spk_embed is None else [voice.spk_embed]
        embeds = bundle.talker.prompt_embeds(prompt, spk, voice.prompt_emb if voice.num_patches else None)
        cap = min(duration_step_cap(len(job_text), seconds_per_step), max_prompt_len - embeds.shape[1] - 1)
        gen = torch.Generator().manual_seed(stream_seed(turn_seed, index))
        steps = list(generate(bundle.talker, embeds, voice.prompt_lat, min_new_token=min_new_token,
                              cache_capacity=max_prompt_len, max_steps=cap, generator=gen))
        out.append(bundle.vae.decode(torch.cat([s.gen_lat for s in steps], dim=1))[0].numpy())
    return np.concatenate(out)


def test_fixture_streamed_pcm_equals_offline_talker_vae(fixture_root, bundle):
    """Two turns' talker jobs stepped together: each turn's streamed PCM equals its offline talker + full VAE decode."""
    cfg = dataclasses.replace(_config(fixture_root), talker=TalkerRunnerConfig(max_streams=4, silence_holder=False))
    runner = TalkerRunner(bundle, cfg)
    texts = {"a": ("Hello there, how are you? Fine.", 7), "b": ("Ok.", 11)}
    assert len(talker_job_texts(texts["a"][0])) == 2  # the test covers a turn of several jobs (stream seeds)
    for turn_id, (text, seed) in texts.items():
        runner.enqueue(turn_id, 0, text, None, seed=seed)
    pcm = {turn_id: [] for turn_id in texts}
    while runner.has_work():
        for out in runner.step():
            assert out.error is None
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
    assert runner.num_streams() == 0
    for turn_id, (text, seed) in texts.items():
        streamed = np.concatenate(pcm[turn_id])
        offline = _offline_speech(bundle, text, seed, cfg.talker.max_prompt_len, DEFAULT_MIN_NEW_TOKEN)
        assert streamed.shape == offline.shape
        np.testing.assert_allclose(streamed, offline, rtol=0, atol=1e-4)


def test_engine_two_sessions_concurrently_equal_each_alone(make_engine):
    """Two conversations (greedy and seeded sampling) running together give each one's solo text and PCM."""
    engine = make_engine()
    requests = [lambda tag: _request(f"a{tag}", PROMPT_A, seed=1),
                lambda tag: _request(f"b{tag}", PROMPT_B, seed=5, temperature=0.8)]
    alone = [_run(engine, make("-solo")) for make in requests]
    together = [Recorder() for _ in requests]
    for make, rec in zip(requests, together):
        engine.submit(make("-pair"), rec)
    for rec in together:
        rec.wait()
    assert all(r.events[-1].audio_samples > 0 for r in alone)  # both turns exercise the talker
    assert alone[0].text() != alone[1].text()
    for solo, pair in zip(alone, together):
        assert [e.text for e in pair.outputs() if isinstance(e, TextDelta)] == \
            [e.text for e in solo.outputs() if isinstance(e, TextDelta)]
        assert _done_fields(pair.events[-1])[:5] == _done_fields(solo.events[-1])[:5]
        assert pair.pcm().shape == solo.pcm().shape
        np.testing.assert_allclose(pair.pcm(), solo.pcm(), rtol=0, atol=1e-4)


def test_engine_batched_prefill_of_mixed_prompts_equals_each_alone(make_engine, bundle):
    """Prompts of different lengths (one longer than a chunk, one with audio) prefilled together in padded
    batches give each one's solo greedy text; the batches really hold several prompts."""
    engine = make_engine(prefill_chunk_tokens=240)
    long_text = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)
    audio, _ = _media_turn(bundle, "audio")
    sampling = SamplingParams(max_tokens=10, ignore_eos=True)
    requests = [lambda tag: _request(f"a{tag}", PROMPT_A, max_tokens=10, with_audio=False),
                lambda tag: _request(f"l{tag}", long_text, max_tokens=10, with_audio=False),
                lambda tag: TurnRequest(f"m{tag}", f"m{tag}", (Message("user", audio),), sampling=sampling,
                                        with_audio=False),
                lambda tag: _request(f"b{tag}", PROMPT_B, max_tokens=10, with_audio=False)]
    alone = [_run(engine, make("-solo")) for make in requests]
    widths: list[list[int]] = []
    runner = engine._thinker
    original = runner.scheduler.prefill_batch

    def spy(fits=None, budget=None, fresh_only=False):
        # prepared and encoded off the engine thread, the four arrive at different steps: hold the prefill
        # until all are queued, so they meet in one padded batch (as a burst does when the steps are slower)
        if widths == [] and len(runner.scheduler.prefill_queue) < len(requests):
            return []
        chosen = original(fits, budget, fresh_only)
        widths.append([end - start for _, start, end in chosen])
        return chosen

    runner.scheduler.prefill_batch = spy
    together = [Recorder() for _ in requests]
    for make, rec in zip(requests, together):
        engine.submit(make("-all"), rec)
    for rec in together:
        rec.wait()
    assert any(len(w) >= 2 for w in widths), widths  # several prompts shared a padded batch
    assert all(max(w) * len(w) <= 240 for w in widths if len(w) > 1)
    assert alone[1].events[-1].prompt_tokens > 240  # the long prompt needed more than one chunk
    assert sum(1 for r in alone if r.text()) >= 3  # random-weight bytes: most replies decode to some text
    for solo, batched in zip(alone, together):
        assert isinstance(batched.events[-1], TurnDone)
        assert batched.text() == solo.text()
        assert _done_fields(batched.events[-1])[:5] == _done_fields(solo.events[-1])[:5]


# ---- control: cancel, speculative, failures ---------------------------------------------------------------


def test_engine_cancel_mid_turn_stops_within_one_step_and_leaks_nothing(make_engine):
    """100 turns cancelled at every stage: nothing after TurnCancelled, at most one step of output after the
    cancel, no row, stream, turn or busy slot left, and a later turn is unchanged."""
    engine = make_engine()
    reference = _run(engine, _request("ref", PROMPT_A, seed=4))
    audio_at = [i for i, e in enumerate(reference.events) if isinstance(e, AudioChunk)]
    assert len(audio_at) >= 3
    last_cancellable = audio_at[-2]  # events up to here come from steps before the turn's last one
    hooks, recorders = [], []
    for wave in range(10):  # 10 turns in flight at a time
        for index in range(wave * 10, wave * 10 + 10):
            hooks.append(_CancelAt(engine, f"c{index}", index % (last_cancellable + 1)))
            recorders.append(Recorder(hooks[-1]))
            engine.submit(_request(f"c{index}", PROMPT_A, seed=4), recorders[-1])
        for rec in recorders[-10:]:
            assert isinstance(rec.wait(), TurnCancelled)
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams) == (0, 0, 0)
    for rec, hook in zip(recorders, hooks):
        assert sum(isinstance(e, _TERMINAL) for e in rec.events) == 1 and rec.events[-1] is hook.late[-1]
        late = hook.late[:-1]  # what the step that saw the cancel request still delivered
        assert sum(isinstance(e, TextDelta) for e in late) <= 1 and sum(isinstance(e, AudioChunk) for e in late) <= 1
        assert rec.events[-1].text == rec.text()
    _close_all(engine, [f"c{i}" for i in range(100)] + ["ref"])
    assert engine.stats().cached_conversations == 0  # a slot still marked busy would stay cached
    _assert_identical(reference, _run(engine, _request("after", PROMPT_A, seed=4)))


def test_engine_confirmed_speculative_turn_equals_normal_turn(make_engine):
    """A speculative turn confirmed mid-audio, or after it ended (it ends within the speculation lookahead),
    yields exactly a normal turn's output."""
    engine = make_engine(engine=dict(speculation_lookahead_ms=60_000.0))
    normal = _run(engine, _request("n", PROMPT_A, seed=3))
    live = Recorder()
    engine.submit(_request("s1", PROMPT_A, seed=3, speculative=True), live)
    _wait_stats(engine, lambda s: s.talker_streams == 1)
    assert live.events == []  # held while speculative
    engine.confirm("s1")
    live.wait()
    parked = Recorder()
    engine.submit(_request("s2", PROMPT_A, seed=3, speculative=True), parked)
    _wait_stats(engine, lambda s: (s.turns, s.preparing, s.thinker_rows, s.talker_streams) == (1, 0, 0, 0))
    assert parked.events == []
    engine.confirm("s2")
    parked.wait()
    for rec in (live, parked):
        _assert_same_output(normal, rec)
    assert [e.stage.value for e in live.events if isinstance(e, StageMark)].count("confirmed") == 1
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams) == (0, 0, 0)


def test_engine_discarded_speculative_turn_emits_nothing_and_frees_slot(make_engine):
    """Speculative turns discarded before stepping, mid-audio and after ending (within the speculation lookahead)
    emit no event and hold nothing."""
    engine = make_engine(engine=dict(speculation_lookahead_ms=60_000.0))
    early, mid, parked = Recorder(), Recorder(), Recorder()
    engine.submit(_request("d0", PROMPT_A, speculative=True), early)
    engine.discard("d0")
    engine.submit(_request("d1", PROMPT_A, speculative=True), mid)
    _wait_stats(engine, lambda s: s.talker_streams == 1)
    engine.discard("d1")
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams) == (0, 0, 0)
    engine.submit(_request("d2", PROMPT_B, speculative=True), parked)
    _wait_stats(engine, lambda s: (s.turns, s.preparing, s.thinker_rows, s.talker_streams) == (1, 0, 0, 0))
    engine.discard("d2")
    assert engine.stats().turns == 0
    _close_all(engine, ["d0", "d1", "d2"])
    assert engine.stats().cached_conversations == 0
    after = _run(engine, _request("n", PROMPT_A))  # every event of the discarded turns would have arrived by now
    assert isinstance(after.events[-1], TurnDone)
    assert early.events == mid.events == parked.events == []


def test_engine_failing_turns_do_not_affect_a_running_turn(make_engine):
    """Turns that fail (prompt too long, bad image, unknown voice, duplicate id) mid-way through another turn
    get TurnFailed while that turn's output stays exactly its solo output."""
    engine = make_engine()
    solo = _run(engine, _request("solo", PROMPT_A, seed=5))
    bad = {
        "long": _request("long", "word " * 600),
        "image": TurnRequest("image", "image", (Message("user", (Content.of_image(np.zeros((2, 2, 3), np.uint8)),)),)),
        "voice": _request("voice", PROMPT_B, voice="no-such-voice"),
        "dup": _request("main", PROMPT_B),
    }
    failures = {name: Recorder() for name in bad}

    def inject(event):
        if isinstance(event, AudioChunk) and not any(r.events for r in failures.values()):
            for name, request in bad.items():
                engine.submit(request, failures[name])

    main = Recorder(inject)
    engine.submit(_request("main", PROMPT_A, conversation="main", seed=5), main)
    main.wait()
    messages = {name: rec.wait() for name, rec in failures.items()}
    assert all(isinstance(m, TurnFailed) for m in messages.values())
    assert messages["long"].message.startswith("prompt of ") and "exceeds the context budget" in messages["long"].message
    assert messages["image"].message == "image 2x2 is smaller than 32 pixels on a side"
    assert messages["voice"].message == "unknown voice 'no-such-voice'"
    assert messages["dup"] == TurnFailed("main", "duplicate turn id", FailureCode.ADMISSION_FAILED)
    assert {name: m.code for name, m in messages.items()} == {
        "long": FailureCode.CONTEXT_LENGTH_EXCEEDED, "image": FailureCode.INVALID_PROMPT, "voice": FailureCode.INVALID_PROMPT,
        "dup": FailureCode.ADMISSION_FAILED}
    _assert_identical(solo, main)
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams) == (0, 0, 0)


def test_thinker_step_in_flight_skips_rows_cancelled_meanwhile(fixture_root, bundle):
    """The engine keeps one thinker step queued across its command boundary: a turn cancelled (barge-in) while
    its step is in flight yields nothing from that step, the other rows carry on, and the cancelled
    conversation's next turn continues from its cached prefix (the in-flight token's K/V included)."""
    from realtime_ming.engine.thinker_runner import ThinkerRunner

    # the pace off: no prompt is held between chunks by the host's time, so both rows still generate here
    runner = ThinkerRunner(bundle, _config(fixture_root, prefill_step_ms=0.0))
    for turn_id, text in (("a", PROMPT_A), ("b", PROMPT_B)):
        runner.admit(_request(turn_id, text))
    while runner.scheduler.prefill_queue:  # both prompts prefilled, both rows generating
        runner.step()
    launched = runner.launch()
    assert {r.request.turn_id for r in launched.decoded} == {"a", "b"}
    cached = list(runner.scheduler.rows["a"].slot.ids)
    runner.cancel("a")
    outputs = runner.collect(launched)
    assert [o.turn_id for o in outputs] == ["b"] and "a" not in runner.scheduler.rows
    runner.admit(_request("a2", "And the mountains?", conversation="a"))
    a2 = runner.scheduler.rows["a2"]
    assert a2.cached_tokens > 0 and a2.slot.ids == cached[:a2.cached_tokens]


def test_prefill_batch_stays_within_a_graphed_shape(fixture_root, bundle):
    """With prefill graphs, a batch of queued prompts is not grown past the last shape a graph serves (rows
    are padded to a power of two and rows x width must stay within the budget), even where the unpadded
    batch would still fit the budget."""

    from realtime_ming.engine.graphs import pick_bucket
    from realtime_ming.engine.thinker_runner import ThinkerRunner

    probe = ThinkerRunner(bundle, _config(fixture_root))
    probe.admit(_request("probe", PROMPT_A))
    width = len(probe.scheduler.rows["probe"].tail_ids)
    widths = (32, 64, 128, 256, 512)
    budget = 8 * pick_bucket(widths, width)  # the 8-row graph of this width is the largest that fits
    assert budget // width > 8  # ... while 9 unpadded rows still fit the budget
    runner = ThinkerRunner(bundle, _config(fixture_root, prefill_chunk_tokens=budget))
    for i in range(12):
        runner.admit(_request(f"t{i}", PROMPT_A))
    assert len(runner.scheduler.prefill_batch()) == budget // width  # no graphs (CPU): the budget alone

    def fits(w, rows):  # the graphs a prefiller with this budget captures
        r = pick_bucket((1, 2, 4, 8, 16), rows)
        return r is not None and pick_bucket([x for x in widths if x * r <= budget], w) is not None

    assert len(runner.scheduler.prefill_batch(fits)) == 8


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_engine_usage_splits_the_prompt_by_modality(make_engine, bundle, kind):
    """TurnDone splits the prompt into text / audio / image tokens: the media share is exactly the number of
    patch placeholder ids in the tokenised prompt; a follow-up turn of the same conversation reports the
    reused prefix (media included) as cached, split the same way."""
    engine = make_engine(hooks=EngineHooks(forced_reply="Fine."))
    content, items = _media_turn(bundle, kind)
    first = _run(engine, TurnRequest("u1", "conv", (Message("user", content),),
                                     sampling=SamplingParams(max_tokens=4, ignore_eos=True), with_audio=False))
    ids = list(bundle.tokenizer.build_prompt([ChatMessage("user", items)]).input_ids)
    media = bundle.tokenizer.media
    patches = ids.count(media.image_patch if kind == "image" else media.audio_patch)
    d1 = first.events[-1]
    assert isinstance(d1, TurnDone) and patches > 0
    expected = (len(ids) - patches, patches, 0) if kind == "audio" else (len(ids) - patches, 0, patches)
    assert (d1.prompt.text, d1.prompt.audio, d1.prompt.image) == expected
    assert d1.prompt.total == d1.prompt_tokens and d1.cached.total == d1.cached_tokens == 0
    history = (Message("user", content), Message("assistant", (Content.of_text(d1.text),)))
    second = _run(engine, _request("u2", PROMPT_B, conversation="conv", history=history, with_audio=False))
    d2 = second.events[-1]
    assert d2.cached.total == d2.cached_tokens > len(ids) - 1
    assert (d2.cached.audio, d2.cached.image) == expected[1:] and (d2.prompt.audio, d2.prompt.image) == expected[1:]
    assert d1.talker_steps == d2.talker_steps == 0  # text responses run no talker step


def test_engine_counts_talker_steps_of_a_spoken_turn(make_engine):
    """A spoken turn reports the talker steps it ran (its output audio tokens); each produced audio."""
    engine = make_engine(hooks=EngineHooks(forced_reply="Hello there, friend."))
    rec = _run(engine, _request("s", PROMPT_A, max_tokens=6, with_audio=True))
    done = rec.events[-1]
    assert isinstance(done, TurnDone) and done.audio_samples > 0
    assert done.talker_steps >= 1
    assert done.audio_samples == rec.pcm().size
