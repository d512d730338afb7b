"""Shared pieces of the attack drivers: a minimal GA client, /health polling and process gauges."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

__all__ = ["Client", "HealthProbe", "ProcessGauge", "health_address", "noise_pcm16_b64", "percentile"]

WIRE_RATE_HZ = 24000


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) of `values` (linear interpolation); nan when empty."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def noise_pcm16_b64(seconds: float, dbfs: float = -50.0, seed: int = 0, rate_hz: int = WIRE_RATE_HZ) -> str:
    """Seeded white noise as base64 PCM16 (background noise: exercises the VAD without starting a turn)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(int(seconds * rate_hz)) * 10 ** (dbfs / 20)
    return base64.b64encode(np.clip(np.rint(x * 32768), -32768, 32767).astype("<i2").tobytes()).decode()


def health_address(url: str) -> tuple[str, int]:
    """(host, port) of the HTTP side of a ws:// realtime URL."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "wss" else 80)


class Client:
    """One GA Realtime connection: send events, read frames (every frame kept in `frames`)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict] = []

    @classmethod
    async def open(cls, url: str, api_key: str | None = None) -> "Client":
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=30)
        client = cls(ws)
        first = await client.recv(30)
        if first["type"] != "session.created":
            raise RuntimeError(f"expected session.created, got {first['type']}")
        return client

    async def send(self, **event) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self, timeout: float = 30.0) -> dict:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.frames.append(frame)
        return frame

    async def recv_until(self, *types: str, timeout: float = 60.0) -> dict:
        """Read until a frame of one of `types`; returns it."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv(timeout)
                if frame["type"] in types:
                    return frame

    async def text_turn(self, text: str, timeout: float = 120.0) -> tuple[dict, float]:
        """A user text message, then `response.create`: (its response, seconds from response.create to done)."""
        await self.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": text}]})
        sent = time.perf_counter()
        await self.send(type="response.create")
        response = (await self.recv_until("response.done", timeout=timeout))["response"]
        return response, time.perf_counter() - sent

    async def close(self) -> None:
        await self.ws.close()


@dataclass
class HealthProbe:
    """Polls GET /health every `interval_s` on fresh connections and records each round trip (ms)."""

    host: str
    port: int
    interval_s: float = 0.02
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0

    async def once(self) -> float:
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(f"GET /health HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        if not raw.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(raw[:80].decode(errors="replace"))
        return (time.perf_counter() - start) * 1e3

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.latencies_ms.append(await asyncio.wait_for(self.once(), 10))
            except (OSError, RuntimeError, TimeoutError):
                self.failures += 1
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass

    def summary(self) -> dict:
        v = self.latencies_ms
        return {"n": len(v), "failures": self.failures, "p50_ms": round(percentile(v, 50), 2),
                "p95_ms": round(percentile(v, 95), 2), "max_ms": round(max(v), 2) if v else None,
                "mean_ms": round(statistics.fmean(v), 2) if v else None}


class ProcessGauge:
    """RSS (MiB) and open file descriptors of a process, read from /proc (Linux)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()

    def rss_mib(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("VmRSS not found")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def sample(self) -> dict:
        return {"rss_mib": round(self.rss_mib(), 1), "fds": self.fds()}
