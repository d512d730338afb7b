"""Session soak: many sessions (connect, one turn, close); the server's RSS and open fds stay flat.

Gauges are read from /proc of the server process (`pid`) after a warm-up of `warmup` sessions (the
allocator and caches settle) and at the end, once the server reports no session left.
"""

from __future__ import annotations

import asyncio
import time

from .common import Client, ProcessGauge

__all__ = ["soak"]


async def _one(url: str, i: int, api_key: str | None) -> str:
    client = await Client.open(url, api_key)
    try:
        await client.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Hello {i}"}]})
        await client.send(type="response.create", response={"output_modalities": ["text"], "max_output_tokens": 4})
        done = await client.recv_until("response.done")
        return done["response"]["status"]
    finally:
        await client.close()


async def soak(url: str, *, sessions: int = 1000, concurrency: int = 4, warmup: int = 20, pid: int | None = None,
               api_key: str | None = None, max_rss_growth_mib: float = 64.0, max_fd_growth: int = 8,
               settle=None) -> dict:
    """Run `sessions` sessions, `concurrency` at a time. `settle` (an async callable) waits until the
    server holds no session before each gauge reading (default: a short sleep)."""
    gauge = ProcessGauge(pid)

    async def wait_settled() -> None:
        if settle is not None:
            await settle()
        else:
            await asyncio.sleep(1.0)

    statuses: dict[str, int] = {}
    errors = 0

    async def run(indices) -> None:
        nonlocal errors
        for i in indices:
            try:
                status = await _one(url, i, api_key)
                statuses[status] = statuses.get(status, 0) + 1
            except Exception:  # a refused or broken session counts; the soak goes on
                errors += 1

    async def batch(first: int, count: int) -> None:
        await asyncio.gather(*(run(range(first + k, first + count, concurrency)) for k in range(concurrency)))

    await batch(0, warmup)
    await wait_settled()
    statuses.clear()
    before = gauge.sample()
    start = time.perf_counter()
    await batch(warmup, sessions)
    wall = time.perf_counter() - start
    await wait_settled()
    after = gauge.sample()
    report = {"sessions": sessions, "statuses": statuses, "errors": errors, "wall_s": round(wall, 1),
              "sessions_per_s": round(sessions / wall, 1), "start": before, "end": after,
              "rss_growth_mib": round(after["rss_mib"] - before["rss_mib"], 1),
              "fd_growth": after["fds"] - before["fds"]}
    report["ok"] = (errors == 0 and statuses.get("failed", 0) == 0
                    and report["rss_growth_mib"] <= max_rss_growth_mib and report["fd_growth"] <= max_fd_growth)
    return report
