"""Audio flood: one client sends minutes of audio as fast as the server takes it (server VAD on)
while another polls /health. Acceptance: /health p50 <= `max_p50_ms` during the flood."""

from __future__ import annotations

import asyncio
import time

from .common import Client, HealthProbe, health_address, noise_pcm16_b64

__all__ = ["flood"]


async def flood(url: str, *, audio_s: float = 600.0, append_s: float = 1.0, max_p50_ms: float = 20.0,
                api_key: str | None = None, max_wall_s: float | None = None) -> dict:
    """Send `audio_s` seconds of background noise in `append_s` appends, unpaced; poll /health meanwhile.

    `max_wall_s` stops the flood early (the server may pace ingestion); the report says how much
    audio went in and how fast."""
    client = await Client.open(url, api_key)
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "create_response": False}}}})
    await client.recv_until("session.updated")
    host, port = health_address(url)
    probe = HealthProbe(host, port)
    for _ in range(5):  # idle baseline
        await probe.once()
    idle = [await probe.once() for _ in range(20)]
    chunk = noise_pcm16_b64(append_s)
    stop = asyncio.Event()

    async def drain() -> None:
        while True:
            await client.recv(3600)

    reader = asyncio.create_task(drain())
    poller = asyncio.create_task(probe.run(stop))
    sent, start = 0.0, time.perf_counter()
    try:
        while sent < audio_s and (max_wall_s is None or time.perf_counter() - start < max_wall_s):
            await client.send(type="input_audio_buffer.append", audio=chunk)
            sent += append_s
        await client.send(type="input_audio_buffer.clear")  # a marker: the server has read everything
        while not any(f["type"] == "input_audio_buffer.cleared" for f in client.frames):
            await asyncio.sleep(0.01)
    finally:
        wall = time.perf_counter() - start
        stop.set()
        await poller
        reader.cancel()
        await client.close()
    errors = [f for f in client.frames if f["type"] == "error"]
    report = {"audio_s": sent, "wall_s": round(wall, 2), "x_real_time": round(sent / wall, 1),
              "health_idle_p50_ms": round(sorted(idle)[len(idle) // 2], 2), "health": probe.summary(),
              "errors": len(errors)}
    report["ok"] = bool(probe.latencies_ms) and report["health"]["p50_ms"] <= max_p50_ms and not probe.failures
    return report
