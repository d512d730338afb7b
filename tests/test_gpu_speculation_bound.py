"""Bounded speculation on CUDA with graphs on (tiny model; thinker, talker and VAE on cuda:0): a speculative turn
paused at its lookahead (its talker stream parked off the graphed rows, its row state copied on the talker's CUDA
stream) and confirmed yields bit for bit its never-paused output; confirmed while another turn speaks (its stream
restored to another row, other graph buckets) it yields that output within the batching tolerance."""

from __future__ import annotations

import pytest
import torch
from speculation_support import STORY, _request, _run, confirm_paused_turns

from realtime_ming.engine import Engine
from realtime_ming.engine.config import EngineConfig, PlacementConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.segmenter import SegmenterConfig

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def gpu_engine():
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cfg = EngineConfig(enforce_eager=False, speculation_lookahead_ms=300.0, dtype="float32", encoder_worker=True,
                       thinker=ThinkerRunnerConfig(prefill_chunk_tokens=256, mixed_step_tokens=0),
                       placement=PlacementConfig(thinker_devices=("cuda:0",), talker_device="cuda:0",
                                                 vae_device="cuda:0", encoder_device="cuda:0"),
                       segmenter=SegmenterConfig(first_max_wait_ms=60_000.0))
    engine = Engine.create(cfg, hooks=EngineHooks(forced_reply=STORY))
    yield engine
    engine.close()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_graphed_paused_turn_resumes_exactly(gpu_engine):
    engine = gpu_engine
    normal, other_ref = _run(engine, _request("n")), _run(engine, _request("o", max_tokens=30))
    confirm_paused_turns(engine, normal, other_ref, atol=1e-3)
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams, stats.paused_turns) == (0, 0, 0, 0)
