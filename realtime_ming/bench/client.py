"""One benchmark session over the GA Realtime WebSocket protocol: paced microphone, event reader, turns.

The microphone sends fixed frames against absolute deadlines: frame i of a stream leaves at
t0 + (i + 1) · frame, when a live microphone would have captured its last sample, so turn sample
k was spoken at `start_at + k / rate`. Every timestamp is `trace.clock()` (perf_counter), never
`loop.time()`, which uvloop caches per loop iteration at 1 ms resolution.
In VAD mode the microphone streams silence between turns (as a live one does); in manual mode
it sends only speech, and the turn commits right after its last speech frame.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from .config import BenchConfig, Target, TurnMode
from .trace import ResponseTrace, TurnTrace, b64_num_bytes, clock
from .turns import SpokenTurn

__all__ = ["BenchSession", "Microphone", "PlannedTurn", "SessionError", "session_update"]

log = logging.getLogger(__name__)

_AUDIO_DELTA = "response.output_audio.delta"
_TEXT_DELTAS = frozenset({"response.output_audio_transcript.delta", "response.output_text.delta"})
_TIMINGS = "realtime_ming.response.timings"
_QUIESCE_S = 5.0  # after a timeout: how long to wait for a cancelled response to end


class SessionError(RuntimeError):
    """The server refused the session configuration or ended the connection mid-run."""


@dataclass(frozen=True, slots=True)
class PlannedTurn:
    """One turn of a session's plan; `barge` is spoken over the response (barge-in mode)."""

    turn: SpokenTurn
    is_warmup: bool
    barge: SpokenTurn | None = None


def _frames(pcm16: np.ndarray, frame_num_samples: int) -> list[str]:
    """base64 PCM16 LE payloads of consecutive frames (the last may be shorter)."""
    raw = pcm16.astype("<i2")
    return [base64.b64encode(raw[i : i + frame_num_samples].tobytes()).decode()
            for i in range(0, raw.size, frame_num_samples)]


class _Speech:
    """A speech request: its frames and two futures the turn driver awaits."""

    def __init__(self, frames: list[str]) -> None:
        loop = asyncio.get_running_loop()
        self.frames = frames
        self.started: asyncio.Future[float] = loop.create_future()  # sample 0 spoken at
        self.sent: asyncio.Future[float] = loop.create_future()  # last frame sent at
        self.max_lag_s = 0.0


class Microphone:
    """Real-time paced `input_audio_buffer.append` sender; run `run()` as a task, `speak()` into it."""

    def __init__(self, send: Callable[[str], Awaitable[None]], *, rate_hz: int, frame_ms: int,
                 stream_silence: bool) -> None:
        self._send = send
        self.frame_num_samples = rate_hz * frame_ms // 1000
        self._frame_s = frame_ms / 1000.0
        self._stream_silence = stream_silence
        self._silence = _frames(np.zeros(self.frame_num_samples, np.int16), self.frame_num_samples)[0]
        # One speech at a time: the turn driver awaits `sent` before it speaks again (overflow: block).
        self._requests: asyncio.Queue[_Speech] = asyncio.Queue(maxsize=1)

    def speak(self, pcm16: np.ndarray) -> _Speech:
        """Queue `pcm16` to be spoken from the next frame boundary."""
        speech = _Speech(_frames(pcm16, self.frame_num_samples))
        self._requests.put_nowait(speech)
        return speech

    async def _append(self, payload: str) -> None:
        await self._send(json.dumps({"type": "input_audio_buffer.append", "audio": payload}))

    async def run(self) -> None:
        """Send frames until cancelled (cancel-safe: a cancelled send loses at most one frame)."""
        t0, i = clock(), 0
        speech: _Speech | None = None
        pos = 0
        while True:
            if speech is None:
                if not self._stream_silence and self._requests.empty():
                    speech = await self._requests.get()
                    t0, i = clock(), 0
                elif not self._requests.empty():
                    speech = self._requests.get_nowait()
                if speech is not None:
                    pos = 0
                    speech.started.set_result(t0 + i * self._frame_s)
            deadline = t0 + (i + 1) * self._frame_s
            delay = deadline - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = clock() - deadline
            await self._append(self._silence if speech is None else speech.frames[pos])
            i += 1
            if speech is not None:
                speech.max_lag_s = max(speech.max_lag_s, lag)
                pos += 1
                if pos == len(speech.frames):
                    speech.sent.set_result(clock())
                    speech = None


def _merge(base: dict, extra: dict) -> dict:
    """Deep merge of JSON objects (`extra` wins)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def session_update(cfg: BenchConfig, target: Target) -> dict[str, Any]:
    """The GA `session` object the bench sends (PCM 24 kHz both ways, audio output, turn mode)."""
    pcm = {"type": "audio/pcm", "rate": cfg.sample_rate_hz}
    turn_detection: dict | None = None
    if cfg.mode is TurnMode.VAD:
        turn_detection = {"type": "server_vad"}
        if cfg.vad_silence_ms is not None:
            turn_detection["silence_duration_ms"] = cfg.vad_silence_ms
        if cfg.vad_threshold is not None:
            turn_detection["threshold"] = cfg.vad_threshold
    session: dict[str, Any] = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"format": pcm, "turn_detection": turn_detection}, "output": {"format": pcm}},
    }
    if cfg.voice is not None:
        session["audio"]["output"]["voice"] = cfg.voice
    if cfg.max_output_tokens is not None:
        session["max_output_tokens"] = cfg.max_output_tokens
    if cfg.instructions is not None:
        session["instructions"] = cfg.instructions
    return _merge(session, target.session)


class BenchSession:
    """One WebSocket session speaking a plan of turns; `run()` returns one `TurnTrace` per planned turn."""

    def __init__(self, cfg: BenchConfig, target: Target, index: int, plan: Sequence[PlannedTurn],
                 on_turn: Callable[[TurnTrace], None] | None = None) -> None:
        self.cfg, self.target, self.index, self.plan = cfg, target, index, list(plan)
        self._on_turn = on_turn
        self._ws: ClientConnection | None = None
        self._changed = asyncio.Condition()
        self._responses: dict[str, ResponseTrace] = {}
        self._active: set[str] = set()
        self._is_in_speech = False
        self._trace = TurnTrace(index, -1, "(setup)", True, 0.0)
        self._setup_events: list[dict] = []
        self.timings_enabled = False
        self.session_echo: dict | None = None  # the session.updated the server sent back
        self.traces: list[TurnTrace] = []

    # ---- connection ------------------------------------------------------------------------
    async def run(self) -> list[TurnTrace]:
        """Connect, configure, speak every planned turn; never raises for server-side failures."""
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else None
        try:
            async with asyncio.timeout(self.cfg.connect_timeout_s):
                self._ws = await connect(self.target.ws_url, additional_headers=headers, max_size=None,
                                         compression=None)
            async with self._ws:
                await self._configure()
                async with asyncio.TaskGroup() as tasks:
                    mic = Microphone(self._ws.send, rate_hz=self.cfg.sample_rate_hz, frame_ms=self.cfg.frame_ms,
                                     stream_silence=self.cfg.mode is TurnMode.VAD)
                    reader = tasks.create_task(self._read())
                    sender = tasks.create_task(mic.run())
                    try:
                        await self._drive(mic)
                    finally:
                        sender.cancel()
                        reader.cancel()
        except* (WebSocketException, OSError, TimeoutError, SessionError) as group:
            failure = f"{type(group.exceptions[0]).__name__}: {group.exceptions[0]}"
            log.warning("session %d on %s: %s", self.index, self.target.name, failure)
            self._fail_rest(failure[:300])
        return self.traces

    def _fail_rest(self, failure: str) -> None:
        done = len(self.traces)
        if done and self.traces[-1].failure is None and not self._is_settled(self.traces[-1]):
            self.traces[-1].failure = failure
        for k, planned in enumerate(self.plan[done:], start=done):
            trace = TurnTrace(self.index, k, planned.turn.name, planned.is_warmup, planned.turn.speech_end_s,
                              failure=failure)
            self.traces.append(trace)
            if self._on_turn is not None:
                self._on_turn(trace)

    async def _recv_setup(self, wanted: str) -> dict:
        async with asyncio.timeout(self.cfg.connect_timeout_s):
            while True:
                frame = json.loads(await self._ws.recv())
                self._setup_events.append(frame)
                if frame.get("type") in (wanted, "error"):
                    return frame

    async def _configure(self) -> None:
        first = await self._recv_setup("session.created")
        if first.get("type") != "session.created":
            raise SessionError(f"first event is not session.created: {json.dumps(first)[:300]}")
        await self._ws.send(json.dumps({"type": "session.update", "session": session_update(self.cfg, self.target)}))
        answer = await self._recv_setup("session.updated")
        if answer["type"] == "error":
            raise SessionError(f"session.update rejected: {json.dumps(answer['error'])[:300]}")
        self.session_echo = answer.get("session")
        if self.cfg.timing_events:
            # Separate update: a server that rejects the unknown key keeps the config above.
            opt_in = {"type": "realtime", "realtime_ming": {"timing_events": True}}
            await self._ws.send(json.dumps({"type": "session.update", "session": opt_in}))
            answer = await self._recv_setup("session.updated")
            echo = {}
            if answer["type"] == "session.updated":
                self.session_echo = answer.get("session")
                echo = answer.get("session", {}).get("realtime_ming", {})
            self.timings_enabled = bool(isinstance(echo, dict) and echo.get("timing_events"))

    async def _read(self) -> None:
        async for message in self._ws:
            t = clock()
            self._on_event(json.loads(message), t)
            async with self._changed:
                self._changed.notify_all()
        raise SessionError("the server closed the connection")

    def _on_event(self, frame: dict, t: float) -> None:
        kind, trace = frame.get("type"), self._trace
        if kind == _AUDIO_DELTA:
            response = self._responses.get(frame.get("response_id", ""))
            if response is not None:
                response.add_audio(t, b64_num_bytes(frame.get("delta", "")) // 2)
        elif kind in _TEXT_DELTAS:
            response = self._responses.get(frame.get("response_id", ""))
            if response is not None and response.first_text_at is None:
                response.first_text_at = t
        elif kind == "input_audio_buffer.speech_started":
            self._is_in_speech = True
            trace.speech_started_at.append(t)
        elif kind == "input_audio_buffer.speech_stopped":
            self._is_in_speech = False
            trace.speech_stopped_at.append(t)
        elif kind == "input_audio_buffer.committed":
            trace.committed_at.append(t)
        elif kind == "response.created":
            response = ResponseTrace(frame["response"]["id"], t)
            self._responses[response.response_id] = response
            self._active.add(response.response_id)
            trace.responses.append(response)
        elif kind == "response.done":
            self._on_done(frame["response"], t)
        elif kind == _TIMINGS:
            response = self._responses.get(frame.get("response_id", ""))
            if response is not None:
                response.timings = dict(frame.get("timings", {}))
        elif kind == "error":
            error = frame.get("error", {})
            trace.errors.append({"code": error.get("code"), "message": error.get("message"), "at": t})

    def _on_done(self, body: dict, t: float) -> None:
        response = self._responses.get(body.get("id", ""))
        if response is None:  # a response created before this session's first turn
            return
        response.done_at = t
        response.status = body.get("status")
        response.reason = (body.get("status_details") or {}).get("reason")
        response.usage = body.get("usage")
        self._active.discard(response.response_id)

    # ---- turns -----------------------------------------------------------------------------
    async def _wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `predicate()` holds (re-checked on every event); False on timeout."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(predicate)
            return True
        except TimeoutError:
            return False

    def _is_settled(self, trace: TurnTrace) -> bool:
        """All speech sent and heard, every stop committed, every commit answered, nothing running.

        speech_stopped and its committed arrive as separate frames: a stop not yet committed is
        a turn still in flight, not a settled one.
        """
        done = sum(r.done_at is not None for r in trace.responses)
        return (trace.speech_sent_at is not None and not self._is_in_speech and not self._active
                and len(trace.committed_at) >= len(trace.speech_stopped_at)
                and done >= max(1, len(trace.committed_at)))

    async def _speak(self, mic: Microphone, pcm16: np.ndarray) -> tuple[float, _Speech]:
        speech = mic.speak(pcm16)
        return await speech.started, speech

    async def _drive(self, mic: Microphone) -> None:
        for k, planned in enumerate(self.plan):
            turn = planned.turn
            trace = TurnTrace(self.index, k, turn.name, planned.is_warmup, turn.speech_end_s)
            self._trace = trace
            self.traces.append(trace)
            pcm16 = turn.pcm16
            if self.cfg.mode is TurnMode.MANUAL:
                end = -(-turn.speech_end_sample // mic.frame_num_samples) * mic.frame_num_samples
                pcm16 = pcm16[:end]
            trace.speech_start_at, speech = await self._speak(mic, pcm16)
            trace.speech_sent_at = await speech.sent
            if self.cfg.mode is TurnMode.MANUAL:
                await self._ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                await self._ws.send(json.dumps({"type": "response.create"}))
                trace.commit_sent_at = clock()
            if planned.barge is not None:
                await self._barge_in(mic, trace, planned.barge)
            trace.max_send_lag_s = speech.max_lag_s
            if not await self._wait(lambda t=trace: self._is_settled(t), self.cfg.turn_timeout_s):
                trace.failure = "timeout"
                await self._quiesce()
            if self.timings_enabled:
                await self._wait(lambda t=trace: all(r.timings is not None for r in t.responses if r.done_at),
                                 self.cfg.timings_wait_s)
            if self._on_turn is not None:
                self._on_turn(trace)
            await asyncio.sleep(self.cfg.pause_s)  # scenario pacing: the user's pause before speaking again

    async def _barge_in(self, mic: Microphone, trace: TurnTrace, barge: SpokenTurn) -> None:
        """Speak `barge` once the first response has played `barge_in_after_ms` of audio."""
        if not await self._wait(lambda: any(r.audio_at or r.done_at is not None for r in trace.responses),
                                self.cfg.turn_timeout_s):
            return
        first = trace.responses[0]
        if first.audio_at:
            await asyncio.sleep(max(0.0, first.audio_at[0] + self.cfg.barge_in_after_ms / 1000.0 - clock()))
        trace.barge_turn_name = barge.name
        trace.barge_end_offset_s = barge.speech_end_s
        trace.barge_start_at, speech = await self._speak(mic, barge.pcm16)
        await speech.sent

    async def _quiesce(self) -> None:
        """After a timeout: cancel what still runs so the next turn starts clean."""
        if self._active:
            await self._ws.send(json.dumps({"type": "response.cancel"}))
        await self._wait(lambda: not self._active, _QUIESCE_S)
