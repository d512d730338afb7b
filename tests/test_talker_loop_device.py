"""The talker process's loop thread and its replica's CUDA device (`engine/talker_loop.py`), without a GPU.

CUDA's current device is per host thread and a new thread starts on cuda:0: the loop's thread must make its
replica's device current before it touches CUDA (a replica on cuda:1 would otherwise put whatever its runner's
device guards miss on cuda:0). And a capture asked of a loop whose thread is gone fails instead of waiting forever
(the talker process's main thread waits there, and the engine's start behind it)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from realtime_ming.engine import talker_loop
from realtime_ming.engine.talker_loop import TalkerLoop

pytestmark = pytest.mark.timeout(60)


class _Runner:
    """What `TalkerLoop` reads of a runner, with nothing to step."""

    def __init__(self, device: str, has_work=lambda: False):
        self.device = torch.device(device)
        self.replica = SimpleNamespace(index=0)
        self.counts = {}
        self.has_work = has_work

    def pending(self, turn_id: str) -> bool:
        return False


def _set_device_calls(device: str) -> list[tuple[torch.device, str]]:
    """(device, calling thread's name) of every `torch.cuda.set_device` while a loop over a runner on `device`
    runs and closes."""
    calls, entered = [], threading.Event()

    def set_device(d):
        calls.append((torch.device(d), threading.current_thread().name))
        entered.set()

    with mock.patch.object(talker_loop.torch.cuda, "set_device", set_device):
        loop = TalkerLoop(_Runner(device), lambda outputs: None, lambda events: None, lambda reason: None)
        if torch.device(device).type == "cuda":
            assert entered.wait(10)
        loop.close()
        assert not loop._thread.is_alive()
    return calls


def test_the_loop_thread_makes_its_replicas_gpu_current():
    assert _set_device_calls("cuda:1") == [(torch.device("cuda", 1), "realtime-ming-talker-0")]


def test_a_loop_off_cuda_sets_no_device():
    assert _set_device_calls("cpu") == []


def test_a_capture_on_a_dead_loop_thread_fails_instead_of_waiting():
    def gone():
        raise SystemExit("the loop thread ends")

    died = []
    loop = TalkerLoop(_Runner("cpu", has_work=gone), lambda outputs: None, lambda events: None, died.append)
    loop._thread.join(10)
    assert not loop._thread.is_alive() and died and "SystemExit" in died[0]
    with pytest.raises(RuntimeError, match="thread is gone"):
        loop.capture()
