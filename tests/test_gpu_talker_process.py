"""A talker process (`engine.talker.driver: process`) on a GPU gives its CUDA IPC references back: once it is closed
and the parent drops its replica, the parent's GPU memory is what it was before the replica was loaded. (A child
that kept the adopted weights until `exit_now` never handed its references back: the parent's blocks stayed
allocated for its life, and its exit warned "Producer process has been terminated before all shared CUDA tensors
released".)"""

from __future__ import annotations

import gc

import pytest
import torch

from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.talker_process import ProcessTalker

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _allocated(device: torch.device) -> int:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.ipc_collect()  # frees the blocks whose every consumer has let go
    return torch.cuda.memory_allocated(device)


def test_a_closed_talker_process_gives_the_replica_memory_back():
    device = torch.device("cuda", 0)
    cfg = EngineConfig(dtype="float32", enforce_eager=False,
                       placement=PlacementConfig(thinker_devices=("cpu",), encoder_device="cpu",
                                                 talker_devices=(str(device),)),
                       talker=TalkerRunnerConfig(max_streams=4, buckets=(1, 2, 4), driver="process"))
    before = _allocated(device)
    bundle = ModelBundle.load(cfg)
    replica = bundle.talker_replicas[0]
    weights = sum(t.numel() * t.element_size() for module in (replica.talker, replica.vae)
                  for t in module.state_dict().values() if t.device == device)
    assert weights > 0 and _allocated(device) - before >= weights
    died = []
    proc = ProcessTalker(bundle, cfg, replica, lambda outputs: None, lambda: None, died.append)
    proc.capture()  # the child's graphs read the adopted weights too
    proc.close()
    assert died == [] and proc._proc.exitcode == 0  # stopped cleanly
    del proc, replica, bundle
    left = _allocated(device) - before
    assert left < weights // 10, f"{left} of the replica's {weights} bytes still allocated after close"
