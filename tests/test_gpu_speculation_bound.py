"""Bounded speculation on CUDA with graphs on (tiny model; thinker, talker and VAE on cuda:0): a speculative turn
paused at its lookahead (its talker stream parked off the graphed rows, its row state copied on the talker's CUDA
stream) and confirmed yields bit for bit its never-paused output; confirmed while another turn speaks (its stream
restored to another row, other graph buckets) it yields that output within the batching tolerance."""

from __future__ import annotations

import time

import pytest
import torch
from test_speculation_bound import (
    STORY,
    Recorder,
    _assert_same_output,
    _paused_speculative,
    _request,
    _run,
)

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk
from realtime_ming.engine.config import (
    EngineConfig,
    PlacementConfig,
    ThinkerRunnerConfig,
)
from realtime_ming.engine.segmenter import SegmenterConfig

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def gpu_engine():
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cfg = EngineConfig(enforce_eager=False, speculation_lookahead_ms=300.0,
                       placement=PlacementConfig(thinker_devices=("cuda:0",), talker_device="cuda:0",
                                                 vae_device="cuda:0", encoder_device="cuda:0"),
                       thinker=ThinkerRunnerConfig(forced_reply=STORY),
                       segmenter=SegmenterConfig(first_max_wait_ms=60_000.0))
    engine = Engine.create(cfg)
    yield engine
    engine.close()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_graphed_paused_turn_resumes_exactly(gpu_engine):
    engine = gpu_engine
    normal, other_ref = _run(engine, _request("n")), _run(engine, _request("o", max_tokens=30))
    spec = _paused_speculative(engine, "s")
    engine.confirm("s")
    spec.wait()
    _assert_same_output(normal, spec)
    beside, other = _paused_speculative(engine, "s2"), Recorder()
    engine.submit(_request("o2", max_tokens=30), other)
    while not any(isinstance(e, AudioChunk) for e in other.events):
        time.sleep(0.002)
    engine.confirm("s2")
    beside.wait(), other.wait()
    _assert_same_output(normal, beside, atol=1e-3)
    _assert_same_output(other_ref, other, atol=1e-3)
    stats = engine.stats()
    assert (stats.turns, stats.thinker_rows, stats.talker_streams, stats.paused_turns) == (0, 0, 0, 0)
