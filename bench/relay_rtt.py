"""Per-frame relay cost of the Ray Serve ingress: round trips of a cheap event through each target.

One session per target; `input_audio_buffer.clear` → `input_audio_buffer.cleared` is answered by the
session layer without the engine, so its round trip is transport + protocol only. The targets alternate
in blocks (A, B, B, A, ...) so drift of a shared machine hits both alike. The difference of the medians
is what the ingress adds to one client→server frame plus one server→client frame.

    python bench/relay_rtt.py ws://127.0.0.1:8000/v1/realtime ws://127.0.0.1:8001/v1/realtime
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from websockets.asyncio.client import connect


async def _round_trips(url: str, n: int) -> list[float]:
    async with connect(url, ping_interval=None, max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "session.created":
            pass
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            while json.loads(await ws.recv())["type"] != "input_audio_buffer.cleared":
                pass
            out.append((time.perf_counter() - start) * 1000.0)
        return out


def _summary(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=100)
    return f"n={len(ms)} p50={statistics.median(ms):.2f} p90={q[89]:.2f} p99={q[98]:.2f} ms"


async def main(urls: list[str], blocks: int = 10, per_block: int = 100) -> None:
    rtts: dict[str, list[float]] = {u: [] for u in urls}
    order = [*urls, *reversed(urls)]
    for _ in range(blocks // 2):
        for url in order:
            rtts[url] += await _round_trips(url, per_block)
    for url, ms in rtts.items():
        print(f"{url}: {_summary(ms)}")
    if len(urls) == 2:
        a, b = (statistics.median(rtts[u]) for u in urls)
        print(f"median RTT difference (first - second): {a - b:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
