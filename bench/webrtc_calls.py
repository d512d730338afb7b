"""WebRTC calls against a running server: call setup time, how fast a client's clear silences the track, and the
server's CPU per call while replies play.

Per level N (`--calls 1,4`): N calls open at once (mint an ephemeral key, post the offer to /v1/realtime/calls,
data channel open, `session.created`: the setup time), each asks for a spoken reply to a typed message; once a
reply has played `--listen-s` on every call, the server's CPU (utime + stime of `--server-pid`, from /proc) is
read over `--window-s` of playback (after every reply is generated, unless `--no-after-done`: then it is
the media path's cost alone, as the playout still holds the rest of each reply), then every call sends `output_audio_buffer.clear`: clear → the
`output_audio_buffer.cleared` event, and clear → the last frame of the track that still carried sound (what a
listener hears of the cut). Writes `result.json` and `summary.md` to `--out`.

    realtime-ming serve --port 8000 --set session.max_output_tokens=4096 \\
        --hook forced_reply="$(python3 -c 'print("It is sunny in Paris today. " * 40)')" &
    python3 -m bench.webrtc_calls --url http://127.0.0.1:8000 --calls 1,4 --server-pid $! --out OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

LOUD = 0.01  # a 20 ms frame whose peak is above this carried sound


class Call:
    """One call: its events with arrival times, and the arrival time of each loud frame of the server's track."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("oai-events")
        self.pc.addTransceiver("audio", direction="recvonly")
        self.events: list[tuple[float, dict]] = []
        self.loud: list[float] = []
        self.changed = asyncio.Event()
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._listen(track)))

    def _on_message(self, message: str) -> None:
        self.events.append((time.perf_counter(), json.loads(message)))
        self.changed.set()

    async def _listen(self, track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if np.abs(frame.to_ndarray()).max() / 32768 > LOUD:
                self.loud.append(time.perf_counter())

    async def wait(self, kind: str, since: float = 0.0, timeout: float = 120.0) -> float:
        deadline = time.perf_counter() + timeout
        while True:
            for at, event in self.events:
                if at >= since and event["type"] == kind:
                    return at
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no {kind} within {timeout:g} s")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), 0.5)
            except TimeoutError:
                pass

    async def open(self, http: httpx.AsyncClient, url: str, api_key: str | None) -> tuple[float, float]:
        """Mint, offer, answer, wait for session.created: (seconds it took, of which the POST of the offer)."""
        started = time.perf_counter()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        minted = await http.post(f"{url}/v1/realtime/client_secrets", json={}, headers=headers)
        minted.raise_for_status()
        await self.pc.setLocalDescription(await self.pc.createOffer())
        posted = time.perf_counter()
        answer = await http.post(f"{url}/v1/realtime/calls", content=self.pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp",
                                          "Authorization": f"Bearer {minted.json()['value']}"})
        answer.raise_for_status()
        answered = time.perf_counter() - posted
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        await self.wait("session.created")
        return time.perf_counter() - started, answered

    def send(self, **event) -> None:
        self.channel.send(json.dumps(event))


def _cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _level(url: str, n: int, args: argparse.Namespace) -> dict:
    calls = [Call() for _ in range(n)]
    async with httpx.AsyncClient(timeout=60) as http:
        opened = await asyncio.gather(*(c.open(http, url, args.api_key) for c in calls))
    for c in calls:
        c.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        c.send(type="conversation.item.create",
               item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk to me."}]})
        c.send(type="response.create")
    started = await asyncio.gather(*(c.wait("output_audio_buffer.started") for c in calls))
    await asyncio.sleep(max(0.0, max(started) + args.listen_s - time.perf_counter()))
    if args.after_done:  # the replies are generated: the window sees the media path, not the engine
        await asyncio.gather(*(c.wait("response.done", timeout=600) for c in calls))
    cpu0, t0 = _cpu_s(args.server_pid), time.perf_counter()
    await asyncio.sleep(args.window_s)
    cpu1, t1 = _cpu_s(args.server_pid), time.perf_counter()
    playing = [bool(c.loud) and c.loud[-1] > t1 - 0.2 for c in calls]
    sent = []
    for c in calls:
        sent.append(time.perf_counter())
        c.send(type="output_audio_buffer.clear")
    cleared = await asyncio.gather(*(c.wait("output_audio_buffer.cleared", since=s) for c, s in zip(calls, sent)))
    await asyncio.sleep(1.0)
    silent_after = [max([t for t in c.loud if t <= s + 1.0], default=s) - s for c, s in zip(calls, sent)]
    for c in calls:
        await c.pc.close()
    ms = lambda values: [round(v * 1000, 1) for v in values]  # noqa: E731
    return {
        "calls": n,
        "setup_ms": ms([o[0] for o in opened]),
        "offer_post_ms": ms([o[1] for o in opened]),
        "clear_to_cleared_ms": ms([c - s for c, s in zip(cleared, sent)]),
        "clear_to_last_sound_ms": ms(silent_after),
        "playing_during_window": playing,
        "server_cpu_percent_per_call": None if cpu0 is None else round(100 * (cpu1 - cpu0) / (t1 - t0) / n, 1),
    }


def _summary(levels: list[dict]) -> str:
    lines = ["| calls | setup ms (median) | of it the offer's POST | clear → cleared ms (median) | clear → last sound ms "
             "(max) | server CPU % per call | playing in the window |", "|---|---|---|---|---|---|---|"]
    for r in levels:
        lines.append(f"| {r['calls']} | {statistics.median(r['setup_ms'])} | {statistics.median(r['offer_post_ms'])} | "
                     f"{statistics.median(r['clear_to_cleared_ms'])} | {max(r['clear_to_last_sound_ms'])} | "
                     f"{r['server_cpu_percent_per_call']} | {sum(r['playing_during_window'])}/{r['calls']} |")
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace) -> None:
    levels = [await _level(args.url.rstrip("/"), int(n), args) for n in args.calls.split(",")]
    print(_summary(levels))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"args": vars(args), "levels": levels}, indent=2))
        (out / "summary.md").write_text(_summary(levels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's HTTP origin")
    parser.add_argument("--api-key", default=None, help="the API key that mints the ephemeral keys")
    parser.add_argument("--calls", default="1,4", help="comma-separated numbers of concurrent calls")
    parser.add_argument("--listen-s", type=float, default=1.0, help="playback heard before the CPU window")
    parser.add_argument("--window-s", type=float, default=3.0, help="the CPU measurement window")
    parser.add_argument("--after-done", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the CPU once every reply is generated (media only), not while it is")
    parser.add_argument("--server-pid", type=int, default=None, help="the server's pid (CPU from /proc; Linux)")
    parser.add_argument("--out", default=None, help="folder for result.json and summary.md")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
