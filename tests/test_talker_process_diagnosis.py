"""A talker process (`engine.talker.driver: process`) that stalls is reported, never waited for silently: it tells the
parent each start-up phase it reaches, every wait on it is bounded (its start, the weights' send included, and its
graph capture) and each such error names the child's state and last phase. And device identity: a replica's streams
leave its own GPU current whatever their order, and tensors adopted from another device are refused. (Issue 48: the
process talker on a GPU of its own hung on 2x H200 with nothing to say where.)"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

import talker_process_support
from realtime_ming.engine import talker_process, talker_sync
from realtime_ming.engine.models import adopt_replica
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_process import ProcessTalker
from realtime_ming.engine.talker_replica import TalkerReplica
from engine_support import _config, bundle  # noqa: F401 - bundle: shared fixture

pytestmark = pytest.mark.timeout(300)

_PHASES = ["started", "cpu current", "weights received", "weights adopted on cpu", "runner built",
           "loop thread on cpu", "capturing graphs", "graphs captured", "first op applied", "first step launched",
           "first step finished", "first output sent"]


def _no_talker_children() -> bool:
    return not [p for p in multiprocessing.active_children() if p.name.startswith("realtime-ming-talker")]


def test_a_talker_process_reports_each_start_up_phase_in_order(fixture_root, bundle, caplog):  # noqa: F811
    replica = bundle.talker_replicas[0]
    pcm, idle = [], threading.Event()
    with caplog.at_level(logging.DEBUG, logger="realtime_ming.engine.talker_process"):
        proc = ProcessTalker(bundle, _config(fixture_root), replica, pcm.extend, idle.set, lambda reason: None)
        try:
            assert "alive" in proc.describe() and "last phase" in proc.describe()
            proc.capture()
            proc.enqueue(Enqueue("t", 0, "Hello there.", None, 1))
            while proc.pending("t"):
                assert idle.wait(60), proc.describe()
                idle.clear()
                proc.outputs()
            assert any(o.pcm is not None and o.pcm.size for o in pcm)
            described = proc.describe()
        finally:
            proc.close()
    heard = [r.args[1] for r in caplog.records if r.name == "realtime_ming.engine.talker_process"
             and r.getMessage().startswith("talker process 0: ")]
    assert heard == _PHASES
    assert described.startswith(f"pid {proc.pid} on cpu, alive, last phase 'first output sent' at ")


def _blob_replica() -> TalkerReplica:
    blob = talker_process_support.Blob()
    return TalkerReplica(0, blob, blob, torch.device("cpu"), torch.device("cpu"))


def test_a_child_stuck_before_reading_its_weights_fails_the_start_in_time(fixture_root, bundle):  # noqa: F811
    """Its weights outgrow the pipe's buffer, so their send waits for a read that never comes: the start still ends
    at `start_timeout`, the child is killed and the error says it never reported a phase."""
    with mock.patch.object(talker_process, "child_main", talker_process_support.never_reads), \
            pytest.raises(RuntimeError) as raised:
        ProcessTalker(bundle, _config(fixture_root), _blob_replica(), lambda outputs: None, lambda: None,
                      lambda reason: None, start_timeout=3.0)
    message = str(raised.value)
    assert message.startswith("talker process 0 did not start: no answer in 3 s (pid ")
    assert "on cpu" in message and "no phase reported" in message
    assert _no_talker_children()


def test_a_capture_that_never_ends_fails_in_time_naming_the_last_phase(fixture_root, bundle):  # noqa: F811
    with mock.patch.object(talker_process, "child_main", talker_process_support.never_captures):
        proc = ProcessTalker(bundle, _config(fixture_root), _blob_replica(), lambda outputs: None, lambda: None,
                             lambda reason: None, capture_timeout=2.0)
    try:
        with pytest.raises(RuntimeError, match=r"talker process 0: no graph capture in 2 s \(pid \d+ on cpu, alive, "
                                               r"last phase 'stand-in started' at 0.5 s, "):
            proc.capture()
    finally:
        proc.close()
    assert proc._proc.exitcode == 0 and _no_talker_children()


def test_adopted_tensors_on_another_device_are_refused(bundle):  # noqa: F811
    """`load_state_dict(assign=True)` keeps a tensor where it is: a replica whose tensors are not all on its device
    would have its kernels read another GPU's memory, so the child refuses to start (naming a tensor)."""
    replica = bundle.talker_replicas[0]
    talker = dict(replica.talker.state_dict())
    name = next(iter(talker))
    talker[name] = torch.empty_like(talker[name], device="meta")
    with pytest.raises(ValueError, match=rf"the talker's adopted tensors must be on cpu: 1 are not \({name} on meta\)"):
        adopt_replica(bundle.cfg, 0, talker, replica.vae.state_dict(), device=torch.device("cpu"),
                      vae_device=torch.device("cpu"), dtype=bundle.dtype)


class _FakeCuda:
    """CUDA's current device and per-device current stream as torch keeps them: making a stream current makes its
    device current too (`torch.cuda.set_stream`, which `torch.cuda.stream` uses), `torch.cuda.device` switches the
    device only; both restore on exit."""

    def __init__(self):
        self.device, self.streams = 0, {}

    def Stream(self, device):  # noqa: N802 - torch.cuda.Stream
        return SimpleNamespace(device=torch.device(device))

    @contextlib.contextmanager
    def stream(self, stream):
        index = stream.device.index
        before = self.device, self.streams.get(index)
        self.device, self.streams[index] = index, stream
        try:
            yield
        finally:
            self.device, self.streams[index] = before

    @contextlib.contextmanager
    def cuda_device(self, device):
        before, self.device = self.device, torch.device(device).index
        try:
            yield
        finally:
            self.device = before


@pytest.mark.parametrize("vae_first", [False, True], ids=["talker-stream-first", "vae-device-stream-first"])
def test_a_replica_with_its_vae_on_another_gpu_keeps_its_own_gpu_current(vae_first):
    fake = _FakeCuda()
    with mock.patch.object(talker_sync.torch.cuda, "Stream", fake.Stream), \
            mock.patch.object(talker_sync.torch.cuda, "stream", fake.stream), \
            mock.patch.object(talker_sync.torch.cuda, "device", fake.cuda_device):
        streams = talker_sync.TalkerStreams(torch.device("cuda", 1), torch.device("cuda", 2))
        order = [torch.device("cuda", 2), torch.device("cuda", 1)] if vae_first else \
            [torch.device("cuda", 1), torch.device("cuda", 2)]
        streams._talker = {d: streams._talker[d] for d in order}
        with streams.talker():
            assert fake.device == 1  # Triton launches, events and device-less tensors go to the talker's GPU
            assert {i: s for i, s in fake.streams.items() if s is not None} == {
                d.index: s for d, s in streams._talker.items()}
        assert fake.device == 0 and all(s is None for s in fake.streams.values())
        with streams.vae():
            assert fake.device == 2 and fake.streams[2] is streams._vae
