"""What the GPU engine tests share: an engine on the fixture checkpoint running a text and an audio turn.

Nothing here is a test."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from unittest import mock

import numpy as np

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (Content, Message, SamplingParams, TurnCancelled, TurnDone, TurnFailed,
                                     TurnRequest)
from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig, ThinkerRunnerConfig
from realtime_ming.engine.segmenter import SegmenterConfig
from conftest import fixture_tokenizers

_TERMINAL = (TurnDone, TurnFailed, TurnCancelled)


def _turn_wait_s() -> float:
    """How long a turn may take: 60 s, under the GPU suites' limits, so a turn that never ends fails the test with
    its last events instead of running into the suite's timeout (`GPU_TURN_WAIT_S` overrides it: a hang
    diagnostic such as bench/talker_process_gpu.sh waits longer, to dump the stacks while it hangs)."""
    return float(os.environ.get("GPU_TURN_WAIT_S", "60"))


def talker_processes(engine: Engine) -> list:
    """The engine's process talkers (`engine.talker.driver: process`; none for the inline talker)."""
    talker = engine._talker
    members = getattr(talker, "members", [talker])
    return [m for m in members if hasattr(m, "describe")]


def stalled(engine: Engine) -> str:
    """What a turn that does not end leaves to read: each talker child's state (pid, device, its last start-up phase),
    and every Python thread's stack of this process and of each live talker child on stderr (faulthandler; a child
    dumps on SIGUSR1 and goes on), so the test's own output shows where it waits."""
    lines = []
    for member in talker_processes(engine):
        lines.append(f"talker process {member.replica.index}: {member.describe()}")
        if member.pid is not None and member._proc.is_alive():
            os.kill(member.pid, signal.SIGUSR1)
    print("\n".join(["######## a turn did not end:", *lines, "######## this process's threads:"]), file=sys.stderr,
          flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    return "; ".join(lines) or "no talker process"


def turns(engine: Engine, tag: str, with_audio: bool = False) -> list[TurnDone]:
    rng = np.random.default_rng(3)
    wave = (0.1 * rng.standard_normal(16000)).astype(np.float32)
    sampling = SamplingParams(max_tokens=24, ignore_eos=True)
    requests = [TurnRequest(f"t{tag}", f"t{tag}", (Message("user", (Content.of_text("Hello, how are you today?"),)),),
                            sampling=sampling, with_audio=with_audio),
                TurnRequest(f"a{tag}", f"a{tag}", (Message("user", (Content.of_audio(wave, 16000),)),),
                            sampling=sampling, with_audio=with_audio)]
    out = []
    for request in requests:
        done, events = threading.Event(), []

        def sink(ev, events=events, done=done):
            events.append(ev)
            if isinstance(ev, _TERMINAL):  # a failed turn ends the wait too: its error is the test's message
                done.set()

        engine.submit(request, sink)
        wait = _turn_wait_s()
        if not done.wait(wait):
            raise AssertionError(f"turn {request.turn_id} did not end in {wait:.0f} s: {events[-3:]}; "
                                 f"{stalled(engine)}")
        assert isinstance(events[-1], TurnDone), events[-1]
        out.append(events[-1])
    return out


def _kv_256():
    """The decode step's attention graphed at 256 and 1024 tokens (the default for 1024 is 512, 1024)."""
    return mock.patch("realtime_ming.engine.thinker_runner.default_kv_buckets", lambda max_seq_len: (256, 1024))


def generate(fixture_root, devices=("cuda:0",), *, eager: bool, dtype: str = "float32", talker: str | None = None,
             driver: str = "inline", expert_dtype: str = "model") -> list[TurnDone]:
    """A text turn and an audio turn (24 tokens each, greedy) on an engine over the fixture checkpoint."""
    device = talker or devices[0]
    with_audio = talker is not None
    # the CPU reference's settings where the CUDA defaults differ (`DEVICE_DEFAULTS`): one engine path compared
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=fixture_tokenizers(fixture_root)[0],
                       talker_tokenizer_path=fixture_tokenizers(fixture_root)[1], dtype=dtype, enforce_eager=eager,
                       expert_dtype=expert_dtype, encoder_worker=True, segmenter=SegmenterConfig(),
                       thinker=ThinkerRunnerConfig(max_slots=4, max_seq_len=1024,
                                                   prefill_chunk_tokens=256, mixed_step_tokens=0),
                       placement=PlacementConfig(thinker_devices=devices, talker_device=device, encoder_device=device,
                                                 vae_device=device),
                       talker=TalkerRunnerConfig(driver=driver))
    with _kv_256():
        engine = Engine.create(cfg, warmup=False)
    try:
        if not eager:
            assert engine._thinker.decoder.graphed
        return turns(engine, "-".join(devices), with_audio)
    finally:
        engine.close()
