"""The mixed step on a GPU (`engine/thinker_mixed.py`): the CUDA-graphed mixer over the fixture thinker (Triton
kernels) equals the separate decode and prefill forwards, and a graphed engine that mixes generates exactly the
tokens of one that does not while turns arrive beside decoding ones (CUDA only)."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import Content, Message, SamplingParams, TextDelta, TurnDone, TurnRequest
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.segmenter import SegmenterConfig
from realtime_ming.engine.thinker_mixed import ThinkerMixer
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.thinker import load_thinker
from conftest import fixture_tokenizers
from thinker_decode_support import mixed_equals_apart

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
pytestmark = [cuda, pytest.mark.timeout(300)]


def test_graphed_mixer_equals_decode_and_prefill_apart(fixture_root):
    torch.backends.cuda.matmul.allow_tf32 = False
    thinker = load_thinker(fixture_root, device="cuda", kernels=TRITON)
    made = []

    def make(cache):
        made.append(ThinkerMixer(thinker, cache, (16, 32, 64), picks=4, dtype=torch.float32, device="cuda"))
        made[-1].capture()
        return made[-1]

    mixer = mixed_equals_apart(thinker, make, 128, device="cuda")
    assert mixer.graphed and not mixer.eager  # the 15 packed rows replayed the 16-row graph


def _engine(fixture_root, mixed: int) -> Engine:
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                       talker_tokenizer_path=fixture_tokenizers(fixture_root)[1], dtype="float32", enforce_eager=False,
                       encoder_worker=True, segmenter=SegmenterConfig(),  # as before the CUDA defaults
                       thinker=ThinkerRunnerConfig(max_slots=6, max_seq_len=1024,
                                                   prefill_chunk_tokens=256, mixed_step_tokens=mixed),
                       placement=PlacementConfig(thinker_devices=("cuda:0",), talker_device="cuda:0",
                                                 encoder_device="cuda:0", vae_device="cuda:0"))
    with mock.patch("realtime_ming.engine.thinker_runner.default_kv_buckets", lambda max_seq_len: (256, 1024)):
        return Engine.create(cfg, warmup=False)  # attention graphed at 256 and 1024, as before


def _staggered(engine: Engine) -> list[TurnDone]:
    """A turn decodes; three more arrive meanwhile (one long prompt): their prefills run beside its decode."""
    sampling = SamplingParams(max_tokens=32, ignore_eos=True)
    texts = ["Hello, how are you today?", " ".join(["The quick brown fox jumps over the lazy dog."] * 8),
             "Tell me something about the sea.", "What is the time?"]
    dones, events = [threading.Event() for _ in texts], [[] for _ in texts]
    started = threading.Event()

    def sink(i):
        def take(ev):
            events[i].append(ev)
            if isinstance(ev, TextDelta):
                started.set()
            if isinstance(ev, TurnDone):
                dones[i].set()
        return take

    for i, text in enumerate(texts):
        engine.submit(TurnRequest(f"t{i}", f"c{i}", (Message("user", (Content.of_text(text),)),), sampling=sampling,
                                  with_audio=False), sink(i))
        if i == 0:
            assert started.wait(60)
    for done in dones:
        assert done.wait(120)
    return [e[-1] for e in events]


def test_graphed_engine_that_mixes_generates_the_plain_engines_tokens(fixture_root):
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {}
    for mixed in (0, 64):
        engine = _engine(fixture_root, mixed)
        try:
            runner, calls = engine._thinker, []
            if mixed:
                original = runner._mixed
                runner._mixed = lambda decoding, fresh_only=False: (calls.append(len(decoding))
                                                                    or original(decoding, fresh_only))
            results[mixed] = _staggered(engine)
            if mixed:
                assert runner.mixer.graphed and calls  # mixed steps ran, from the captured graphs
        finally:
            engine.close()
    for plain, mixing in zip(results[0], results[64]):
        assert mixing.output_tokens == plain.output_tokens == 32
        assert mixing.text == plain.text
