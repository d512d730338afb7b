"""Shutdown under load: `sessions` sessions each have a long spoken reply running when the server is told to stop
(`stop()`: SIGTERM to its process, or an in-process drain). Acceptance: every session gets its reply's
`response.done` (status `cancelled` with error `server_shutting_down` when the drain deadline cut it, or its own
end) before the server's close frame (1001), and no other frame after it."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable

from websockets.exceptions import ConnectionClosed

from .common import Client

__all__ = ["drain"]


async def _reply(url: str, api_key: str | None, started: asyncio.Event, n: int, ready: list) -> Client:
    client = await Client.open(url, api_key)
    await client.send(type="session.update", session={"type": "realtime", "max_output_tokens": "inf"})
    await client.recv_until("session.updated")
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a very long story."}]})
    await client.send(type="response.create")
    await client.recv_until("response.output_audio.delta", "response.output_audio_transcript.delta",
                            "response.done", timeout=120)
    ready.append(client)
    if len(ready) == n:
        started.set()
    return client


async def _outcome(client: Client, timeout_s: float) -> dict:
    """Read to the close: the response.done seen (and when), the close code, frames after response.done."""
    done, after, code = None, 0, None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                frame = await client.recv(timeout_s)
                if done is not None:
                    after += 1
                if frame["type"] == "response.done":
                    done = frame["response"]
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else None
    except TimeoutError:
        code = "timeout"
    details = (done or {}).get("status_details") or {}
    return {"status": done and done["status"], "error": (details.get("error") or {}).get("code"),
            "close": code, "frames_after_done": after}


async def drain(url: str, stop: Callable[[], Awaitable[None] | None], *, sessions: int = 4,
                api_key: str | None = None, timeout_s: float = 60.0) -> dict:
    """Start the replies, call `stop()`, read every session to its close."""
    started, ready = asyncio.Event(), []
    openers = [asyncio.create_task(_reply(url, api_key, started, sessions, ready)) for _ in range(sessions)]
    await asyncio.wait_for(started.wait(), 180)
    clients = [task.result() for task in openers]
    readers = [asyncio.create_task(_outcome(c, timeout_s)) for c in clients]
    stopped_at = time.perf_counter()
    result = stop()
    if result is not None:
        await result
    outcomes = await asyncio.gather(*readers)
    closed_s = time.perf_counter() - stopped_at
    statuses = collections.Counter(f"{o['status']}/{o['error']}" for o in outcomes)
    missing = [o for o in outcomes if o["status"] is None]
    report = {"sessions": sessions, "outcomes": dict(statuses), "close_codes": dict(collections.Counter(
        str(o["close"]) for o in outcomes)), "done_before_close": sessions - len(missing),
              "frames_after_done": sum(o["frames_after_done"] for o in outcomes), "closed_s": round(closed_s, 2)}
    report["ok"] = (not missing and all(o["close"] == 1001 for o in outcomes) and report["frames_after_done"] == 0
                    and all(o["status"] != "cancelled" or o["error"] == "server_shutting_down" for o in outcomes))
    return report
