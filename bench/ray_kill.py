"""A replica killed mid-turn behind the Ray Serve ingress, as the clients see it (issue 45: GPU replicas).

`--sessions` sessions open through the ingress one after another (each learns its replica from the upgrade response's
`x-realtime-ming-replica`), each asks for a spoken reply and plays it at real time from its first delta. Once every
session has heard audio, the replica holding the most sessions is killed (`ray.kill` of its actor, no restart; Serve
starts a replacement). Then, per session: the killed replica's must end with an `error` frame (`replica_lost`) and
close 1012 — how long after the kill; every other session's reply must go on to `response.done` with no playback
stall over `--stall-ms` (a real-time player's longest underrun, before and after the kill). Finally `--fresh`
new sessions open and must land on the surviving replicas and each speak a whole reply.

    python -m bench.ray_kill --url ws://127.0.0.1:8000/v1/realtime --sessions 16 --out OUT
    (on the Ray head node: it joins the running Ray with `ray.init(address="auto")` to kill the actor)

Writes OUT/ray_kill.json (every session's record) and OUT/ray_kill.md (the verdict table); exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import websockets

REPLICA_HEADER = "x-realtime-ming-replica"
RATE_HZ = 24_000  # pcm16 output audio


@dataclass
class Session:
    index: int
    replica: str = ""
    first_audio: float | None = None  # monotonic seconds
    audio_s: float = 0.0
    underrun_s: float = 0.0  # longest stall of a real-time player started at the first delta
    done: str | None = None  # response.done status
    error_code: str | None = None
    close_code: int | None = None
    close_reason: str = ""
    closed_at: float | None = None
    events: int = 0

    def hear(self, pcm_bytes: int, now: float) -> None:
        if self.first_audio is None:
            self.first_audio = now
        due = self.first_audio + self.audio_s  # when a real-time player needs this chunk
        self.underrun_s = max(self.underrun_s, now - due)
        self.audio_s += pcm_bytes / 2 / RATE_HZ


async def _open(url: str, index: int, max_tokens: int) -> tuple[Session, websockets.ClientConnection]:
    ws = await websockets.connect(url, open_timeout=120, ping_interval=None, max_size=None)
    session = Session(index, replica=ws.response.headers.get(REPLICA_HEADER, ""))
    created = json.loads(await asyncio.wait_for(ws.recv(), 60))
    if created.get("type") != "session.created":
        raise RuntimeError(f"session {index}: first event {created.get('type')}")
    await ws.send(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "max_output_tokens": max_tokens, "audio": {"input": {"turn_detection": None}}}}))
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me about the weather."}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    return session, ws


async def _listen(session: Session, ws, heard: asyncio.Event) -> None:
    """Events until response.done, an error or the close; PCM timed as a real-time player hears it."""
    try:
        async for raw in ws:
            event = json.loads(raw)
            session.events += 1
            kind = event.get("type")
            if kind in ("response.output_audio.delta", "response.audio.delta"):
                session.hear(len(base64.b64decode(event["delta"])), time.monotonic())
                heard.set()
            elif kind == "response.done":
                session.done = event["response"]["status"]
                return
            elif kind == "error":
                session.error_code = event["error"].get("code")
    except websockets.ConnectionClosed:
        pass
    finally:
        if ws.close_code is not None or session.error_code is not None:
            session.close_code = ws.close_code
            session.close_reason = ws.close_reason or ""
            session.closed_at = time.monotonic()


def _health(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
        return json.loads(response.read())


def _kill(actor_name: str) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", namespace="serve", logging_level="ERROR")
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)


async def run(args) -> dict:
    base = args.url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/")[0]
    # one after another, as sessions arrive: Serve's router places each by the replicas' queue lengths, which a
    # burst of simultaneous connects sees stale (8 at once went 7 / 1 on two idle replicas; one by one, 4 / 4)
    opened, heard, tasks = [], [], []
    for i in range(args.sessions):
        session, ws = await _open(args.url, i, args.max_tokens)
        opened.append((session, ws))
        heard.append(asyncio.Event())
        tasks.append(asyncio.create_task(_listen(session, ws, heard[-1])))
    sessions = [s for s, _ in opened]
    await asyncio.wait_for(asyncio.gather(*(h.wait() for h in heard)), args.timeout_s)
    await asyncio.sleep(args.kill_after_s)
    counts: dict[str, int] = {}
    for s in sessions:
        counts[s.replica] = counts.get(s.replica, 0) + 1
    health = _health(base)
    victim = max(counts, key=counts.get)
    actor = next(r["actor_name"] for r in health["replicas"] if r["replica"] == victim)
    killed_at = time.monotonic()
    await asyncio.to_thread(_kill, actor)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), args.timeout_s)
    for _, ws in opened:
        await ws.close()
    fresh = []
    for i in range(args.fresh):  # one after another: each must be placed on a live replica
        session, ws = await _open(args.url, args.sessions + i, args.max_tokens)
        await asyncio.wait_for(_listen(session, ws, asyncio.Event()), args.timeout_s)
        await ws.close()
        fresh.append(session)
    lost = [s for s in sessions if s.replica == victim]
    kept = [s for s in sessions if s.replica != victim]
    checks = {
        "sessions on two replicas or more (some lost, some kept)": bool(lost) and bool(kept),
        "lost sessions end with replica_lost, close 1012": all(
            s.error_code == "replica_lost" and s.close_code == 1012 for s in lost),
        "kept sessions complete their reply": all(s.done in ("completed", "incomplete") for s in kept),
        f"kept sessions stall <= {args.stall_ms:.0f} ms": all(s.underrun_s * 1000 <= args.stall_ms for s in kept),
        "fresh sessions avoid the killed replica and speak": all(
            s.replica != victim and s.done in ("completed", "incomplete") and s.audio_s > 0 for s in fresh),
    }
    close_s = sorted(s.closed_at - killed_at for s in lost if s.closed_at is not None)
    return {"url": args.url, "sessions_per_replica": counts, "victim": victim, "actor": actor,
            "lost": len(lost), "kept": len(kept),
            "lost_close_s": {"min": close_s[0], "max": close_s[-1]} if close_s else None,
            "kept_worst_underrun_ms": max((s.underrun_s * 1000 for s in kept), default=0.0),
            "fresh_replicas": [s.replica for s in fresh], "checks": checks,
            "sessions": [asdict(s) for s in sessions + fresh]}


def _markdown(result: dict) -> str:
    lines = [f"# Replica killed mid-turn: {result['url']}", "",
             f"Sessions per replica: {result['sessions_per_replica']}; killed `{result['victim']}`.", "",
             "| check | holds |", "|---|---|"]
    lines += [f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in result["checks"].items()]
    close = result["lost_close_s"]
    lines += ["", f"Lost sessions: {result['lost']}, closed {close['min']:.2f}–{close['max']:.2f} s after the kill."
              if close else f"Lost sessions: {result['lost']} (none closed)",
              f"Kept sessions: {result['kept']}, worst playback stall {result['kept_worst_underrun_ms']:.0f} ms.",
              f"Fresh sessions' replicas: {result['fresh_replicas']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the ingress's ws://HOST:PORT/v1/realtime")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--fresh", type=int, default=2, help="sessions opened after the kill")
    parser.add_argument("--max-tokens", type=int, default=64, help="each reply's max_output_tokens")
    parser.add_argument("--kill-after-s", type=float, default=1.0, help="after every session heard audio")
    parser.add_argument("--stall-ms", type=float, default=200.0, help="a kept session's allowed playback stall")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_kill.json").write_text(json.dumps(result, indent=1))
    report = _markdown(result)
    (args.out / "ray_kill.md").write_text(report)
    print(report)
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
