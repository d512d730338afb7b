"""Admission's media encoders off the engine thread.

A turn's admission (`ThinkerRunner.admit`) matches the conversation's cached prefix on the engine thread;
the media in the new tail (audio clips: mel frontend + Whisper encoder + projector; images and video
frames: vision encoder + projector) are encoded here, on one worker thread with its own CUDA stream(s),
while the engine thread keeps stepping the running turns' decode and talker. At 64 live spoken sessions
the encoders took ~260 ms per admission on the engine thread (one H200), stalling every stream behind
them; here they cost the engine thread nothing but the GIL the worker's launches take.

The result (`Encoded`) carries a CUDA event recorded on the worker's stream after the outputs were
written: the engine thread makes its own stream wait for it (`Encoded.take`, device-side, no host sync)
before the embedding splice reads them, and marks the outputs as used by its stream, so the caching
allocator does not hand their memory back to the worker while the splice is still queued. Jobs run one
at a time, in submission order, with the same modules and inputs as on the engine thread: the embeddings
are the same numbers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import torch

from ..model.multimodal import MediaKind
from .input_processor import expand_payloads

__all__ = ["Encoded", "EncoderWorker", "encode_tail", "tail_has_media"]

log = logging.getLogger(__name__)


def tail_has_media(spans, start: int) -> bool:
    """Whether any media placeholder lies in the prompt tail from token `start` (its encoders must run)."""
    return any(span.start >= start for span in spans)


def encode_tail(bundle, vision: Callable, spans, payloads, start: int) -> dict:
    """Encoder outputs for the media whose placeholders lie in the tail (from token `start`), as the keyword
    arguments of `prepare_prefill`. `vision(payload)` gives an image's preprocessed pixels."""
    images, frames, audio = [], [], []
    for span, (kind, payload) in zip(spans, expand_payloads(payloads, spans)):
        if span.start < start:
            continue
        if kind is MediaKind.AUDIO:
            audio.append(bundle.encode_audio(payload))
        elif kind is MediaKind.IMAGE:
            vi = vision(payload)  # prepared already, unless the slot lost the image meanwhile
            images.append(bundle.encode_image(vi.pixel_values, vi.grid_thw))
        else:
            frames.append(bundle.encode_image(*payload))
    out = {"audio_clips": audio}
    if images:
        out["image_embeds"] = torch.cat(images)
    if frames:
        out["video_embeds"] = torch.cat(frames)
    return out


@dataclass(frozen=True, slots=True)
class Encoded:
    """A tail's encoder outputs (`prepare_prefill` keyword arguments), complete on the device once `ready`
    (a CUDA event; None on the CPU) has fired."""

    embeds: dict
    ready: object | None

    def take(self, device: torch.device) -> dict:
        """The outputs, for work queued on `device`'s current stream from now on (which waits for them
        device-side; the host does not)."""
        if self.ready is None:
            return self.embeds
        stream = torch.cuda.current_stream(device)
        stream.wait_event(self.ready)
        for value in self.embeds.values():
            for t in (value if isinstance(value, list) else [value]):
                if t.is_cuda:
                    t.record_stream(torch.cuda.current_stream(t.device))
        return self.embeds


@dataclass(frozen=True, slots=True)
class _Job:
    spans: tuple
    payloads: tuple
    start: int
    future: Future


# On a CPU host the encoders' threads run this much nicer than the engine thread (Linux: niceness is per thread,
# and the threads that torch's intra-op pool starts from this one inherit it). A big image's vision encoder (a
# 2048 x 2048 image: ~17 K patches, seconds of CPU) then takes what the engine thread's steps leave rather than
# half of every core: the other sessions' decode steps keep their pace, the image's turn waits longer instead
# (issue 43, finding 9). No effect without contention; CUDA encoders (launches only) are left as they are.
_CPU_ENCODER_NICENESS = 10


def _yield_cpu_to_the_engine() -> None:
    """Lower the calling thread's CPU priority by `_CPU_ENCODER_NICENESS` (Linux only; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return  # PRIO_PROCESS with a thread id is per thread only on Linux
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + _CPU_ENCODER_NICENESS)
    except OSError as exc:  # a sandbox that refuses it: the encoders share the CPU evenly, as before
        log.warning("encoder worker: could not lower its CPU priority: %s", exc)


class EncoderWorker:
    """One thread encoding admitted turns' tails in submission order (`submit` -> a Future of `Encoded`).
    `on_done` is called (on the worker thread) after each job's future is resolved: the engine's wake-up."""

    def __init__(self, bundle, vision: Callable, *, out_device: torch.device,
                 on_done: Callable[[], None] | None = None):
        self.bundle = bundle
        self._vision = vision
        self._out_device = torch.device(out_device)
        self._on_done = on_done
        self._encoder_device = torch.device(bundle.devices["encoder"])
        devices = {self._encoder_device, self._out_device}
        # the worker's own streams, on every CUDA device it touches (the encoders', the thinker's for the copy)
        self._streams = {d: torch.cuda.Stream(d) for d in devices if d.type == "cuda"}
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="realtime-ming-encoders", daemon=True)
        self._thread.start()

    def submit(self, spans, payloads, start: int) -> Future:
        future: Future = Future()
        self._jobs.put(_Job(tuple(spans), tuple(payloads), start, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        if self._encoder_device.type == "cpu":
            _yield_cpu_to_the_engine()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():  # cancelled while queued
                continue
            try:
                job.future.set_result(self._encode(job))
            except BaseException as exc:  # noqa: B036 - reported to the turn's admission, the worker goes on
                job.future.set_exception(exc)
            if self._on_done is not None:
                try:
                    self._on_done()
                except Exception:
                    log.exception("encoder worker: waking the engine failed")

    def _encode(self, job: _Job) -> Encoded:
        with contextlib.ExitStack() as stack, torch.no_grad():
            for stream in self._streams.values():
                stack.enter_context(torch.cuda.stream(stream))
            if self._encoder_device.type == "cuda":  # entering a stream makes its device current: the encoders' last
                stack.enter_context(torch.cuda.device(self._encoder_device))
            embeds = encode_tail(self.bundle, self._vision, job.spans, job.payloads, job.start)
            ready = None
            if self._out_device.type == "cuda":
                ready = torch.cuda.Event()
                ready.record(self._streams[self._out_device])
        return Encoded(embeds, ready)
