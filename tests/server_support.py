"""Shared helpers of the session and server tests: synthetic audio, wire encoding, a scripted VAD, stub engines, an
in-process server and a validating WebSocket client (`served_cli`, the CLI server as a child process, is in
tests/served_cli_support.py).

Speech comes from espeak-ng (skipped when it is not installed); noise is seeded. Nothing here is
a test; `test_session*.py` and `test_server*.py` import it.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from realtime_ming.audio.resample import resample
from realtime_ming.engine.api import TurnDone

WIRE_RATE_HZ = 24000


def espeak(text: str, folder: Path, rate_hz: int = WIRE_RATE_HZ) -> np.ndarray:
    """espeak-ng speech as float32 at `rate_hz`, leading/trailing silence trimmed."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (apt-get install -y espeak-ng)")
    path = folder / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    wav, sr = sf.read(path, dtype="float32")
    x = resample(wav, sr, rate_hz)
    loud = np.flatnonzero(np.abs(x) > 1e-3)
    return x[loud[0] : loud[-1] + 1]


def white_noise(dbfs: float, seconds: float, seed: int, rate_hz: int = WIRE_RATE_HZ) -> np.ndarray:
    """Gaussian white noise at an RMS of `dbfs`."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * rate_hz)) * 10 ** (dbfs / 20)).astype(np.float32)


def music_like_noise(dbfs: float, seconds: float, rate_hz: int = WIRE_RATE_HZ) -> np.ndarray:
    """A low chord of four slowly amplitude-modulated partials at an RMS of `dbfs`."""
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    partials = [(110.0, 0.0, 0.5), (165.0, 1.0, 0.7), (220.0, 2.0, 0.3), (330.0, 0.5, 1.1)]
    x = sum(np.sin(2 * np.pi * f * t + ph) * (0.5 + 0.5 * np.sin(2 * np.pi * am * t)) for f, ph, am in partials)
    return (x / np.sqrt(np.mean(x**2)) * 10 ** (dbfs / 20)).astype(np.float32)


def tone(seconds: float, rate_hz: int = WIRE_RATE_HZ, amplitude: float = 0.3) -> np.ndarray:
    """A 220 Hz sine (the scripted VAD calls it speech)."""
    t = np.arange(round(seconds * rate_hz)) / rate_hz
    return (amplitude * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)


def silence(seconds: float, rate_hz: int = WIRE_RATE_HZ) -> np.ndarray:
    """Digital silence."""
    return np.zeros(round(seconds * rate_hz), dtype=np.float32)


def pcm16_b64(samples: np.ndarray) -> str:
    """float32 → base64 PCM16 LE (the wire's `audio` field)."""
    pcm = np.clip(np.rint(np.asarray(samples) * 32768.0), -32768, 32767).astype("<i2")
    return base64.b64encode(pcm.tobytes()).decode()


def b64_pcm16_samples(delta: str) -> np.ndarray:
    """base64 PCM16 LE → int16 samples."""
    return np.frombuffer(base64.b64decode(delta), dtype="<i2")


def chunks(samples: np.ndarray, ms: int, rate_hz: int = WIRE_RATE_HZ):
    """Consecutive pieces of `ms` milliseconds (the last may be shorter)."""
    step = rate_hz * ms // 1000
    for start in range(0, samples.size, step):
        yield samples[start : start + step]


class EnergyVad:
    """Scripted VAD for state-machine tests: a 512-sample window is speech when its RMS > 0.05."""

    window_num_samples = 512

    def speech_prob(self, window: np.ndarray) -> float:
        return 1.0 if float(np.sqrt(np.mean(window**2))) > 0.05 else 0.0

    def reset(self) -> None:
        pass


# Paths where our extension PCM rates (16 kHz, 44.1 kHz) legitimately appear. The GA schema
# only knows rate 24000, so those frames are validated with the rate set to 24000 at exactly
# these paths; every other field is validated as sent.
_RATE_PATHS = {
    "session.created": (("session", "audio", "input", "format"), ("session", "audio", "output", "format")),
    "session.updated": (("session", "audio", "input", "format"), ("session", "audio", "output", "format")),
    "response.created": (("response", "audio", "output", "format"),),
    "response.done": (("response", "audio", "output", "format"),),
}
EXTENSION_RATES_HZ = (16000, 44100)


def validate_frame(frame: dict, dialect, *, allow_timings: bool = False, allow_opt_in: bool = False,
                   allow_playout: bool = False) -> None:
    """`realtime_validate.validate_server_event`, tolerating only our extension PCM rates."""
    import copy

    from realtime_validate import validate_server_event

    checked = frame
    for path in _RATE_PATHS.get(frame.get("type"), ()):
        node = frame
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get("type") == "audio/pcm" and node.get("rate") in EXTENSION_RATES_HZ:
            if checked is frame:
                checked = copy.deepcopy(frame)
            target = checked
            for key in path:
                target = target[key]
            target["rate"] = WIRE_RATE_HZ
    validate_server_event(checked, dialect, allow_timings=allow_timings, allow_opt_in=allow_opt_in,
                          allow_playout=allow_playout)


class RecordingEngine:
    """A real engine that remembers every request submitted to it and each turn's TurnDone (`done`)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.requests: list = []
        self.done: dict = {}  # turn_id -> TurnDone

    def submit(self, request, sink) -> None:
        self.requests.append(request)

        def recording(event) -> None:
            if isinstance(event, TurnDone):
                self.done[event.turn_id] = event
            sink(event)
        self._engine.submit(request, recording)

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


class StubEngine:
    """A scripted `EngineHandle` on its own thread, for server tests that need no model output.

    Each turn says `words` one every `step_s` seconds: a TextDelta, then `chunk_s` of a 44.1 kHz
    tone, then TurnDone. Speculative turns hold their events until `confirm`; `cancel` ends a
    turn with TurnCancelled; `stats()` reports the turns still held (the freed-slot check).
    """

    def __init__(self, words: tuple[str, ...] = ("Hello", " there."), chunk_s: float = 0.1, step_s: float = 0.02):
        import queue
        import threading

        self._words, self._chunk_s, self._step_s = words, chunk_s, step_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._turns: dict[str, dict] = {}
        self.submitted: list = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def submit(self, request, sink) -> None:
        self._inbox.put(("submit", request, sink))

    def confirm(self, turn_id: str) -> None:
        self._inbox.put(("confirm", turn_id))

    def discard(self, turn_id: str) -> None:
        self._inbox.put(("discard", turn_id))

    def cancel(self, turn_id: str) -> None:
        self._inbox.put(("cancel", turn_id))

    def close_conversation(self, conversation_id: str) -> None:
        self._inbox.put(("close_conversation", conversation_id))

    def info(self) -> dict:
        return {"model": "stub-ming", "device": "cpu", "dtype": "float32", "voices": ["DB30"], "is_tiny_default": True}

    def voices(self) -> list[str]:
        return ["DB30"]

    def num_turns(self, timeout: float = 5.0) -> int:
        """Turns the engine still holds, after every command sent so far was applied."""
        import threading

        done, box = threading.Event(), []
        self._inbox.put(("count", box, done))
        done.wait(timeout)
        return box[0]

    def close(self) -> None:
        self._inbox.put(("stop",))
        self._thread.join(5.0)

    def _run(self) -> None:
        import queue

        from realtime_ming.engine.api import (
            AudioChunk,
            FinishReason,
            TextDelta,
            TurnCancelled,
            TurnDone,
        )

        while True:
            try:
                cmd = self._inbox.get(timeout=self._step_s)
            except queue.Empty:
                cmd = None
            if cmd is not None:
                kind = cmd[0]
                if kind == "stop":
                    return
                if kind == "submit":
                    request, sink = cmd[1], cmd[2]
                    self.submitted.append(request)
                    self._turns[request.turn_id] = {"sink": sink, "step": 0, "held": request.speculative}
                elif kind == "confirm" and cmd[1] in self._turns:
                    self._turns[cmd[1]]["held"] = False
                elif kind == "discard":
                    self._turns.pop(cmd[1], None)
                elif kind == "cancel" and cmd[1] in self._turns:
                    self._turns.pop(cmd[1])["sink"](TurnCancelled(cmd[1], ""))
                elif kind == "count":
                    cmd[1].append(len(self._turns))
                    cmd[2].set()
                continue
            for turn_id, turn in list(self._turns.items()):
                if turn["held"]:
                    continue
                step, sink = turn["step"], turn["sink"]
                turn["step"] += 1
                if step < len(self._words):
                    sink(TextDelta(turn_id, self._words[step]))
                    sink(AudioChunk(turn_id, tone(self._chunk_s, 44100, 0.1)))
                else:
                    del self._turns[turn_id]
                    text = "".join(self._words)
                    sink(TurnDone(turn_id, text, FinishReason.STOP, 10, 0, len(self._words), 0, {}))


# One scaled time unit for every wait on the server (slow CI machines raise the factor).
TIME_FACTOR = float(os.environ.get("REALTIME_MING_TESTS_TIMEOUT_FACTOR", "1"))


def seconds(value: float) -> float:
    """`value` seconds scaled by REALTIME_MING_TESTS_TIMEOUT_FACTOR."""
    return value * TIME_FACTOR


async def http_request(port: int, path: str, method: str = "GET", headers: dict | None = None):
    """One HTTP/1.1 request on loopback → (status, headers lower-cased, body bytes)."""
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), seconds(5))
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), parsed, body


@asynccontextmanager
async def stub_served(*overrides: str, **stub) -> AsyncIterator:
    """Our server (`server.port=0`, then `overrides`) on a fresh `StubEngine(**stub)`, closed with it."""
    from realtime_ming.server import RealtimeServer, load_config

    engine = StubEngine(**stub)
    try:
        async with RealtimeServer(load_config(None, ["server.port=0", *overrides]), engine) as srv:
            yield srv
    finally:
        engine.close()


@asynccontextmanager
async def text_session(config, engine) -> AsyncIterator:
    """A real server on loopback serving `engine` (recorded) with `config`, and a GA client (every frame it
    receives validated) in a text-only session without turn detection. -> (client, RecordingEngine)."""
    from websockets.asyncio.client import connect

    from realtime_ming.protocol import Dialect
    from realtime_ming.server import RealtimeServer

    recording = RecordingEngine(engine)
    async with RealtimeServer(config, recording) as srv, connect(f"ws://127.0.0.1:{srv.port}/v1/realtime") as ws:
        client = WsClient(ws, Dialect.GA)
        await client.recv_until("session.created")
        await client.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                           "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        yield client, recording


async def refused_then_answered(client, code: str, event_id: str, param: str) -> None:
    """The error `code` for the client's `event_id` at `param` arrives, and a response asked for then completes."""
    error = await client.expect_error(code, timeout=30)
    assert (error["param"], error["event_id"]) == (param, event_id), error
    await client.send(type="response.create")
    done = await client.recv_until("response.done", timeout=60)
    assert done[-1]["response"]["status"] in ("completed", "incomplete")


def assert_cancelled_by_speech(frames: list[dict], response_id: str) -> int:
    """`frames` hold speech_started, then the response.done of `response_id`, cancelled for turn_detected
    (a barge-in); returns the index of that response.done in `frames`."""
    types = [f["type"] for f in frames]
    done_at = types.index("response.done")
    done = frames[done_at]["response"]
    assert types.index("input_audio_buffer.speech_started") < done_at, types
    assert done["id"] == response_id
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected"), done
    return done_at


class WsClient:
    """A raw WebSocket client that validates every server frame it receives."""

    def __init__(self, ws, dialect) -> None:
        self.ws = ws
        self.dialect = dialect
        self.frames: list[dict] = []
        self.allow_timings = False
        self.allow_opt_in = False  # GA events a client opts in to (idle timeout, MCP tools)
        self.allow_playout = False  # `output_audio_buffer.*` (WebRTC, realtime_ming.output_audio_buffer, a clear)

    async def send(self, **event) -> None:
        import json

        await self.ws.send(json.dumps(event))

    async def append_audio(self, samples: np.ndarray, ms: int = 100) -> None:
        """Send `samples` (float32 at the wire rate) as `input_audio_buffer.append` events of `ms` each, at once."""
        for piece in chunks(samples, ms):
            await self.send(type="input_audio_buffer.append", audio=pcm16_b64(piece))

    async def start_long_response(self) -> dict:
        """Ask for a long spoken story (max_output_tokens 4096) and return the response's first audio delta."""
        await self.send(type="session.update", session={"type": "realtime", "max_output_tokens": 4096})
        await self.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story."}]})
        await self.send(type="response.create")
        return (await self.recv_until("response.output_audio.delta", timeout=120))[-1]

    async def recv(self, timeout: float = 5.0) -> dict:
        import asyncio
        import json

        frame = json.loads(await asyncio.wait_for(self.ws.recv(), seconds(timeout)))
        validate_frame(frame, self.dialect, allow_timings=self.allow_timings, allow_opt_in=self.allow_opt_in,
                       allow_playout=self.allow_playout)
        self.frames.append(frame)
        return frame

    async def recv_until(self, event_type: str | tuple[str, ...], timeout: float = 10.0) -> list[dict]:
        """Frames up to and including the first of `event_type`."""
        import asyncio

        got = []
        async with asyncio.timeout(seconds(timeout)):
            while True:
                frame = await self.recv(timeout)
                got.append(frame)
                if frame["type"] == event_type or frame["type"] in event_type:
                    return got

    async def expect_error(self, code: str, timeout: float = 5.0) -> dict:
        """The next frame must be an `error` with `code`; returns its `error` object."""
        frame = await self.recv(timeout)
        assert frame["type"] == "error", frame
        assert frame["error"]["code"] == code, frame["error"]
        return frame["error"]
