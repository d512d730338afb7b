"""Barge-ins: interrupt replies mid-stream, many times, and count responses that end `failed`.

Each barge-in starts a spoken reply to a text turn, waits for its first output delta, then
interrupts it: `response.cancel` (mode "cancel"), or (mode "speech") speech appended under server
VAD, which the server must turn into a cancelled response. Acceptance: 0 `failed` responses, 0
output deltas after a response's `response.done`, every interrupted response ends.
"""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np

from .common import Client

__all__ = ["barge_ins"]

_DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta")


def _pcm16_b64(x: np.ndarray) -> str:
    return base64.b64encode(np.clip(np.rint(x * 32768), -32768, 32767).astype("<i2").tobytes()).decode()


async def _session(url: str, count: int, mode: str, speech: np.ndarray | None, api_key: str | None,
                   stats: dict) -> None:
    client = await Client.open(url, api_key)
    vad = {"type": "server_vad", "create_response": False, "interrupt_response": True} if mode == "speech" else None
    await client.send(type="session.update", session={"type": "realtime", "max_output_tokens": 4096,
                                                      "audio": {"input": {"turn_detection": vad}}})
    await client.recv_until("session.updated")
    try:
        for i in range(count):
            await client.send(type="conversation.item.create", item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Tell me story {i}."}]})
            await client.send(type="response.create")
            created = await client.recv_until("response.created")
            response_id = created["response"]["id"]
            first = await client.recv_until(*_DELTAS, "response.done")
            if first["type"] == "response.done":  # finished before any delta: not a barge-in
                stats["not_interrupted"] += 1
                _account(first, stats)
                continue
            if mode == "speech":
                for k in range(0, speech.size, 2400):  # 100 ms appends, unpaced
                    await client.send(type="input_audio_buffer.append", audio=_pcm16_b64(speech[k:k + 2400]))
            else:
                await client.send(type="response.cancel")
            done = await client.recv_until("response.done")
            _account(done, stats)
            if mode == "speech":  # the interrupting speech becomes a user item; wait for it to end
                await client.recv_until("input_audio_buffer.speech_stopped")
            # anything of the interrupted response arriving after its response.done is late output
            await client.send(type="conversation.item.retrieve", item_id="__marker__")
            while True:
                frame = await client.recv()
                if frame["type"] == "error" and frame["error"].get("param") == "item_id":
                    break
                if frame.get("response_id") == response_id and frame["type"] in _DELTAS:
                    stats["late_deltas"] += 1
            stats["barge_ins"] += 1
    finally:
        await client.close()


def _account(done: dict, stats: dict) -> None:
    status = done["response"]["status"]
    stats[status] = stats.get(status, 0) + 1
    if status == "failed":
        stats.setdefault("failures", []).append(done["response"].get("status_details"))


async def barge_ins(url: str, *, total: int = 1000, sessions: int = 4, mode: str = "cancel",
                    speech: np.ndarray | None = None, api_key: str | None = None) -> dict:
    """`total` barge-ins spread over `sessions` concurrent sessions. `speech` (24 kHz float32, followed
    by silence) is required for mode "speech"."""
    if mode == "speech" and speech is None:
        raise ValueError("mode 'speech' needs speech audio")
    stats = {"barge_ins": 0, "not_interrupted": 0, "late_deltas": 0, "failed": 0}
    start = time.perf_counter()
    per = [total // sessions + (1 if i < total % sessions else 0) for i in range(sessions)]
    await asyncio.gather(*(_session(url, n, mode, speech, api_key, stats) for n in per if n))
    stats["wall_s"] = round(time.perf_counter() - start, 1)
    stats["ok"] = stats["failed"] == 0 and stats["late_deltas"] == 0 and stats["barge_ins"] + stats[
        "not_interrupted"] == total
    return stats
