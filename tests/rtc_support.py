"""A WebRTC client for the tests, built on aiortc (the client side of what the server answers with aiortc too).

`RtcClient.connect(port, key)` offers a data channel `oai-events` and a microphone track (48 kHz; what it plays
is set with `say`), posts the offer to `/v1/realtime/calls`, and keeps everything the server sends: the data
channel's events (each validated against the openai package's GA server-event union, the playout events
included) and the audio of the server's track, with the arrival time of every frame.
"""

from __future__ import annotations

import asyncio
import json
import time

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from realtime_validate import validate_server_event
from server_support import seconds

from realtime_ming.protocol import Dialect
from realtime_ming.audio.pcm import float_to_int16
from realtime_ming.rtc.tracks import audio_frame, read_mic

__all__ = ["MIC_RATE_HZ", "MicTrack", "RtcClient", "mint"]

MIC_RATE_HZ = 48000
_FRAME = 960


class MicTrack(MediaStreamTrack):
    """A paced 48 kHz mono microphone: plays what `say` queued, then silence."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, np.int16)
        self._start: float | None = None
        self._pts = 0

    def say(self, samples: np.ndarray) -> None:
        """Queue float32 48 kHz samples to be spoken next."""
        pcm = np.clip(np.rint(samples * 32767), -32768, 32767).astype(np.int16)
        self._queue = np.concatenate([self._queue, pcm])

    @property
    def speaking(self) -> bool:
        return self._queue.size > 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += _FRAME
            wait = self._start + self._pts / MIC_RATE_HZ - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk, self._queue = self._queue[:_FRAME], self._queue[_FRAME:]
        frame_samples = np.zeros(_FRAME, np.int16)
        frame_samples[: chunk.size] = chunk
        return audio_frame(frame_samples, self._pts)


async def mint(port: int, api_key: str | None = None, **body) -> httpx.Response:
    """POST /v1/realtime/client_secrets with `body` (as the API key `api_key`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=seconds(30)) as http:
        return await http.post(f"http://127.0.0.1:{port}/v1/realtime/client_secrets", json=body, headers=headers)


class RtcClient:
    """One WebRTC call to the server on loopback; `events` holds every data channel event (validated)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("oai-events")
        self.mic = MicTrack()
        self.pc.addTrack(self.mic)
        self.events: list[dict] = []
        self.arrived: list[float] = []  # monotonic arrival time of each event
        self._new = asyncio.Event()
        self.audio: list[tuple[float, np.ndarray]] = []  # (arrival monotonic s, 48 kHz mono int16 frame)
        self.call_id: str | None = None
        self._reader: asyncio.Task | None = None
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self._opened = asyncio.Event()
        self.channel.on("open", self._opened.set)

    def _on_message(self, message: str) -> None:
        event = json.loads(message)
        validate_server_event(event, Dialect.GA, allow_playout=True)
        self.events.append(event)
        self.arrived.append(time.monotonic())
        self._new.set()

    def _on_track(self, track) -> None:
        if track.kind == "audio":
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track) -> None:
        async def keep(samples: np.ndarray) -> None:
            self.audio.append((time.monotonic(), float_to_int16(samples)))

        await read_mic(track, keep)  # the server's decoding of a track: the same code, on this side of the call

    async def connect(self, port: int, key: str | None, *, session: dict | None = None,
                      expect_status: int = 201) -> httpx.Response:
        """Offer, post (application/sdp, or multipart with `session`), apply the answer; returns the response."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = f"http://127.0.0.1:{port}/v1/realtime/calls"
        async with httpx.AsyncClient(timeout=seconds(30)) as http:
            if session is None:
                reply = await http.post(url, content=self.pc.localDescription.sdp,
                                        headers={**headers, "Content-Type": "application/sdp"})
            else:
                files = {"sdp": (None, self.pc.localDescription.sdp, "application/sdp"),
                         "session": (None, json.dumps(session), "application/json")}
                reply = await http.post(url, files=files, headers=headers)
        assert reply.status_code == expect_status, (reply.status_code, reply.text)
        if reply.status_code == 201:
            self.call_id = reply.headers["location"].rsplit("/", 1)[-1]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=reply.text, type="answer"))
            await asyncio.wait_for(self._opened.wait(), seconds(20))
        return reply

    def send(self, **event) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(self, predicate, timeout: float = 30.0) -> dict:
        """The first event (from the start of the call) for which `predicate(event)` holds."""
        deadline = time.monotonic() + seconds(timeout)
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; events so far: {[e['type'] for e in self.events]}")
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except TimeoutError:
                pass

    async def wait_type(self, event_type: str, timeout: float = 30.0, **fields) -> dict:
        return await self.wait_for(lambda e: e["type"] == event_type and all(e.get(k) == v for k, v in fields.items()),
                                   timeout)

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def at(self, event: dict) -> float:
        """When `event` arrived (monotonic s)."""
        return self.arrived[next(i for i, e in enumerate(self.events) if e is event)]

    def heard(self, since: float = 0.0, until: float = float("inf")) -> np.ndarray:
        """The server's audio received in [since, until) (monotonic s), one array."""
        frames = [f for t, f in self.audio if since <= t < until]
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
