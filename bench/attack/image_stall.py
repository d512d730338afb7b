"""Big legal image: while one session sends a large image (2048 x 2048 by default) and asks for a reply, other
sessions stream replies; the longest gap between two consecutive events of any other session is measured.
Acceptance: the gap during the image stays <= `max_gap_s` (1 s) and every session's reply ends."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import numpy as np

from .common import Client

__all__ = ["image_data_url", "image_stall"]


def image_data_url(side: int, seed: int = 0) -> str:
    """A `side` x `side` JPEG (quality 90) of seeded, photo-like noise as a data URL (~1-3 MB at 2048)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    fine = rng.integers(-12, 13, (side, side, 3))
    pixels = np.clip(coarse.astype(np.int16) + fine, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


async def _stream(url: str, api_key: str | None, start: asyncio.Event, stop: asyncio.Event, gaps: list,
                  stats: dict) -> None:
    """Back-to-back text replies; records (gap_s, at) between consecutive frames once `start` is set."""
    client = await Client.open(url, api_key)
    await client.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                      "max_output_tokens": 4096})
    await client.recv_until("session.updated")
    try:
        while not stop.is_set():
            await client.send(type="response.create", response={"conversation": "none", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count slowly."}]}]})
            last = None
            while True:
                frame = await client.recv(120)
                now = time.perf_counter()
                if last is not None and start.is_set():
                    gaps.append((now - last, now))
                last = now
                if frame["type"] == "response.done":
                    stats["replies"] += 1
                    stats["failed"] += frame["response"]["status"] == "failed"
                    break
                if frame["type"] == "error":
                    stats["errors"] += 1
    finally:
        await client.close()


async def image_stall(url: str, *, side: int = 2048, sessions: int = 2, max_gap_s: float = 1.0,
                      api_key: str | None = None, warmup_s: float = 2.0) -> dict:
    """`sessions` streaming sessions; one more sends a `side`^2 image with a reply request."""
    image = image_data_url(side)
    start, stop = asyncio.Event(), asyncio.Event()
    gaps: list[tuple[float, float]] = []
    stats = {"replies": 0, "failed": 0, "errors": 0}
    streams = [asyncio.create_task(_stream(url, api_key, start, stop, gaps, stats)) for _ in range(sessions)]
    sender = await Client.open(url, api_key)
    try:
        await sender.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                          "max_output_tokens": 8})
        await sender.recv_until("session.updated")
        await asyncio.sleep(warmup_s)  # the streams are running
        start.set()
        await asyncio.sleep(0.5)  # a baseline before the image
        sent_at = time.perf_counter()
        await sender.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": image}, {"type": "input_text", "text": "What is this?"}]})
        added = await sender.recv_until("conversation.item.added", "error", timeout=120)
        await sender.send(type="response.create")
        done = await sender.recv_until("response.done", timeout=300)
        finished_at = time.perf_counter()
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await sender.close()
    results = await asyncio.gather(*streams, return_exceptions=True)
    lost = [repr(r) for r in results if isinstance(r, BaseException)]
    before = [g for g, at in gaps if at < sent_at]
    during = [g for g, at in gaps if sent_at <= at <= finished_at + 0.5]
    worst = max(((g, at) for g, at in gaps if sent_at <= at <= finished_at + 0.5), default=(0.0, sent_at))
    report = {"side": side, "image_bytes": len(image) * 3 // 4, "sessions": sessions,
              "image_item": added["type"] if added["type"] != "error" else added["error"]["code"],
              "image_response": done["response"]["status"], "image_s": round(finished_at - sent_at, 2),
              "gap_before_max_s": round(max(before, default=0.0), 3),
              "gap_during_max_s": round(max(during, default=0.0), 3),
              "gap_during_p99_s": round(float(np.percentile(during, 99)) if during else 0.0, 3),
              "gap_during_max_ends_s": round(worst[1] - sent_at, 2),  # when the longest gap ended, after the send
              "events_during": len(during), **stats, "sessions_lost": len(lost), "lost": lost[:3]}
    report["ok"] = (added["type"] == "conversation.item.added" and not lost and bool(during)
                    and report["gap_during_max_s"] <= max_gap_s and stats["failed"] == 0)
    return report
