"""Server CPU / GIL load of N real-time spoken sessions, on the tiny CPU engine.

What a c=64 spoken run costs the server process apart from the model: every session streams 20 ms
`input_audio_buffer.append` frames at real time (an espeak-ng turn, then silence, looped), which the
server parses, decodes, resamples and runs through Silero VAD. The server runs in a child process
(`python -m bench.server_load serve`) with three instruments inside it:

- CPU: process and per-thread CPU time over the measured window → CPU-ms per session-second of audio;
- event-loop lag: a task that sleeps `--tick-ms` and records how late it wakes (p50 / p99 / max);
- a probe thread standing in for the engine thread's admission: every 50 ms it runs `--probe-ops` tiny
  torch ops (what `ThinkerRunner` admission does between its GPU launches) and records its wall time
  and its own CPU time; wall − CPU is the time it waited to run (the GIL, or a CPU core on a small host).

The load clients run in this (parent) process, so their CPU never counts as the server's, and they
measure the WebSocket ping round trip (the keepalive the GPU run's client timed out on). With
`--py-spy` the highest level is also sampled by `py-spy record --gil` (who holds the GIL).

    python -m bench.server_load --sessions 0,8,16,32 --seconds 15 --out bench/out/server-load
    python -m bench.server_load compare runs/before-1 runs/before-2 runs/after-1 ...   # medians per label

Writes `server_load.json` and `server_load.md` into `--out`. Scale honestly: on a host with few cores
the clients, the server and the probe share the cores, so compare levels and before/after on the same
host, not absolute numbers with a GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.server_load_child import pct, serve

_FRAME_MS = 20
_WIRE_RATE_HZ = 24000
_SPY_RATE_HZ = 200


# ---------------------------------------------------------------- the load clients

def _frames(pcm16: np.ndarray) -> list[str]:
    n = _WIRE_RATE_HZ * _FRAME_MS // 1000
    pcm16 = np.concatenate([pcm16, np.zeros((-pcm16.size) % n, np.int16)]).astype("<i2")
    return [base64.b64encode(pcm16[i : i + n].tobytes()).decode() for i in range(0, pcm16.size, n)]


def _session_frames(silence_s: float) -> list[str]:
    """One loop of a session's microphone: an espeak-ng turn then `silence_s` of silence (20 ms frames)."""
    from realtime_ming.bench.turns import default_cache_dir, default_turns

    turn = default_turns(default_cache_dir(), wire_rate_hz=_WIRE_RATE_HZ)[0]
    speech = turn.pcm16[: turn.speech_end_sample]
    return _frames(np.concatenate([speech, np.zeros(int(silence_s * _WIRE_RATE_HZ), np.int16)]))


class _Stats:
    def __init__(self) -> None:
        self.rtts: list[float] = []
        self.send_lag: list[float] = []
        self.events: dict[str, int] = {}
        self.errors: list[str] = []
        self.sent = 0
        self.measuring = False

    def reset(self) -> None:
        self.rtts.clear()
        self.send_lag.clear()
        self.events.clear()
        self.sent = 0
        self.measuring = True


async def _client(url: str, index: int, frames: list[str], stats: _Stats, stop: asyncio.Event,
                  respond: bool) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None, ping_interval=None, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": _WIRE_RATE_HZ},
                                "turn_detection": {"type": "server_vad", "create_response": respond}}}}}))

        async def read() -> None:
            async for raw in ws:
                kind = json.loads(raw).get("type", "?")
                if stats.measuring:
                    stats.events[kind] = stats.events.get(kind, 0) + 1
                if kind == "error":
                    stats.errors.append(str(raw)[:300])

        async def ping() -> None:
            while True:
                await asyncio.sleep(1.0)
                t = time.perf_counter()
                await (await ws.ping())
                if stats.measuring:
                    stats.rtts.append((time.perf_counter() - t) * 1e3)

        tasks = [asyncio.create_task(read()), asyncio.create_task(ping())]
        frame_s = _FRAME_MS / 1e3
        i = (index * 37) % len(frames)  # sessions start at different places of the loop
        t0 = time.perf_counter()
        k = 0
        try:
            while not stop.is_set():
                k += 1
                delay = t0 + k * frame_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif stats.measuring:
                    stats.send_lag.append(-delay * 1e3)
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": frames[i]}))
                if stats.measuring:
                    stats.sent += 1
                i = (i + 1) % len(frames)
        finally:
            for task in tasks:
                task.cancel()


class _Server:
    """The server child: started once per level (fresh process, fresh counters)."""

    def __init__(self, args: argparse.Namespace, sessions: int) -> None:
        cmd = [sys.executable, "-m", "bench.server_load", "serve", "--probe-ops", str(args.probe_ops),
               "--tick-ms", str(args.tick_ms), "--max-sessions", str(sessions),
               "--forced-reply", args.forced_reply]
        if args.switch_interval_ms is not None:
            cmd += ["--switch-interval-ms", str(args.switch_interval_ms)]
        for o in args.override:
            cmd += ["--override", o]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parent.parent)
        hello = json.loads(self._line())
        self.port, self.pid, self.switch_interval_s = hello["port"], hello["pid"], hello["switch_interval_s"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server child exited ({self.proc.wait()})")
        return line

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def stats(self) -> dict[str, Any]:
        self.send("end")
        while True:
            line = self._line()
            if line.startswith('{"stats"'):
                return json.loads(line)["stats"]

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


async def _level(args: argparse.Namespace, sessions: int, frames: list[str], spy_out: Path | None) -> dict[str, Any]:
    server = await asyncio.to_thread(_Server, args, sessions)
    try:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime"
        stats, stop = _Stats(), asyncio.Event()
        clients = [asyncio.create_task(_client(url, i, frames, stats, stop, args.respond)) for i in range(sessions)]
        await asyncio.sleep(args.warmup)
        for c in clients:
            if c.done() and c.exception() is not None:
                raise RuntimeError(f"session failed: {c.exception()!r}")
        stats.reset()
        server.send("begin")
        spy = None
        if spy_out is not None:
            # Popen returns at once; the wait for py-spy runs off the loop (below)
            spy = subprocess.Popen(["py-spy", "record", "--gil", "--idle", "--format", "raw",  # noqa: ASYNC220
                                    "-r", str(_SPY_RATE_HZ), "--threads", "-d", str(int(args.seconds)), "-p", str(server.pid), "-o", str(spy_out)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for second in range(int(args.seconds)):
            await asyncio.sleep(1.0)
            print(f"  c={sessions}: {second + 1}/{int(args.seconds)} s, {stats.sent} frames sent", end="\r",
                  file=sys.stderr, flush=True)
        srv = await asyncio.to_thread(server.stats)
        stats.measuring = False
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
        if spy is not None:
            _, err = await asyncio.to_thread(spy.communicate, timeout=60)
            if spy.returncode:
                print(f"\npy-spy failed: {err.strip()[-300:]}", file=sys.stderr)
        print(file=sys.stderr)
    finally:
        await asyncio.to_thread(server.close)
    audio_s = stats.sent * _FRAME_MS / 1e3
    wall = srv["wall_s"]
    return {
        "sessions": sessions,
        "audio_s_per_s": round(audio_s / wall, 2),
        "server_cpu_ms_per_session_s": round(srv["cpu_ms_per_s"] * wall / audio_s, 2) if audio_s else None,
        "server": srv,
        "ping_rtt_ms": {"p50": pct(stats.rtts, 50), "p99": pct(stats.rtts, 99),
                        "max": round(max(stats.rtts), 3) if stats.rtts else None},
        "client_send_lag_ms": {"n_late": len(stats.send_lag), "p99": pct(stats.send_lag, 99)},
        "events": dict(sorted(stats.events.items())),
        "errors": stats.errors[:5],
        "switch_interval_s": server.switch_interval_s,
    }


def _frame_name(frame: str) -> str:
    """`func (path/to/file.py:12)` → `func (file.py)`."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else func


def _gil_top(raw: Path, rate_hz: int, seconds: float, top: int = 15) -> dict[str, Any]:
    """py-spy raw samples (`--gil --threads`) → GIL share per thread, and the functions seen holding it
    (self: the innermost frame; inclusive: anywhere on the stack, roots seen in > 80 % left out).
    `gil_held_pct`: samples with the GIL held / samples taken (rate x seconds): how busy the GIL was."""
    self_n: dict[str, int] = {}
    incl: dict[str, int] = {}
    threads: dict[str, int] = {}
    self_by_thread: dict[str, dict[str, int]] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        thread = "?"
        if frames[0].startswith("thread ("):  # `thread (tid): name`
            thread = re.sub(r"[-_]\d+$", "", frames[0].partition(": ")[2]) or "?"
            frames = frames[1:]
        threads[thread] = threads.get(thread, 0) + n
        names = [_frame_name(f) for f in frames] or ["?"]
        by_thread = self_by_thread.setdefault(thread, {})
        by_thread[names[-1]] = by_thread.get(names[-1], 0) + n
        self_n[names[-1]] = self_n.get(names[-1], 0) + n
        for f in set(names):
            incl[f] = incl.get(f, 0) + n

    def ranked(d: dict[str, int], cap: float = 100.0) -> list[tuple[str, float]]:
        pct = [(k, round(100.0 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])]
        return [(k, v) for k, v in pct if v <= cap][:top]

    return {"samples": total, "gil_held_pct": round(100.0 * total / (rate_hz * seconds), 1),
            "threads_pct": ranked(threads), "self_pct": ranked(self_n), "inclusive_pct": ranked(incl, 80.0),
            "self_pct_by_thread": {t: ranked(d, 100.0)[:8] for t, d in self_by_thread.items()}}


def _markdown(result: dict[str, Any]) -> str:
    lines = [f"# server_load ({result['label']})", "", f"`{result['command']}`", "",
             f"host: {result['host']['cpus']} CPUs, {result['host']['platform']}, python {result['host']['python']}",
             "",
             ("| sessions | audio s/s | server CPU ms / session-s | server CPU ms/s | loop lag p50 / p99 / max ms "
              "| probe ms p50 / p99 (idle: see c=0) | probe wait p50 / p99 ms | ping RTT p50 / p99 / max ms |"),
             "|---:|---:|---:|---:|---|---|---|---|"]
    for lv in result["levels"]:
        s = lv["server"]
        lag, pr, wt, rtt = s["loop_lag_ms"], s["probe_ms"], s["probe_wait_ms"], lv["ping_rtt_ms"]
        lines.append(f"| {lv['sessions']} | {lv['audio_s_per_s']} | {lv['server_cpu_ms_per_session_s']} | "
                     f"{s['cpu_ms_per_s']} | {lag['p50']} / {lag['p99']} / {lag['max']} | {pr['p50']} / {pr['p99']} | "
                     f"{wt['p50']} / {wt['p99']} | {rtt['p50']} / {rtt['p99']} / {rtt['max']} |")
    idle = next((lv for lv in result["levels"] if lv["sessions"] == 0), None)
    if idle is not None:
        lines += ["", "Net of the idle server (c=0: probe, ticker, engine idle loop): server CPU ms per session-s = "
                  + ", ".join(f"c={lv['sessions']}: {round((lv['server']['cpu_ms_per_s'] - idle['server']['cpu_ms_per_s']) / lv['audio_s_per_s'], 2)}"
                              for lv in result["levels"] if lv["sessions"] and lv["audio_s_per_s"])]
    lines += ["", "Per-thread server CPU (ms per wall s):", ""]
    for lv in result["levels"]:
        fronts = lv["server"].get("frontend_cpu_ms_per_s")
        lines.append(f"- c={lv['sessions']}: " + ", ".join(f"{k} {v}" for k, v in lv["server"]["thread_cpu_ms_per_s"].items())
                     + (f"; front-end processes: {fronts}" if fronts else ""))
    spied = [lv for lv in result["levels"] if lv.get("gil")]
    if spied:
        lines += ["", "GIL held (py-spy --gil samples / samples taken): " + ", ".join(
            f"c={lv['sessions']}: {lv['gil']['gil_held_pct']} %" for lv in spied)]
    if result.get("gil"):
        g = result["gil"]
        lines += ["", f"py-spy --gil at c={g['sessions']} ({g['samples']} samples; % of samples with the GIL held):", "",
                  "GIL by thread: " + ", ".join(f"{k} {v} %" for k, v in g["threads_pct"]), "",
                  "| self | % |", "|---|---:|"] + [f"| `{k}` | {v} |" for k, v in g["self_pct"]]
        lines += ["", "| inclusive | % |", "|---|---:|"] + [f"| `{k}` | {v} |" for k, v in g["inclusive_pct"]]
        for thread, ranked in g["self_pct_by_thread"].items():
            lines += ["", f"{thread}: " + ", ".join(f"`{k}` {v} %" for k, v in ranked)]
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace) -> None:
    levels = [int(x) for x in args.sessions.split(",")]
    frames = _session_frames(args.silence_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    gil = None
    for n in levels:
        spy_out = out / f"py-spy-gil-c{n}.txt" if args.py_spy and shutil.which("py-spy") else None
        print(f"level c={n} (warm-up {args.warmup} s, measure {args.seconds} s)", file=sys.stderr, flush=True)
        lv = await _level(args, n, frames, spy_out)
        results.append(lv)
        s = lv["server"]
        print(f"  c={n}: {lv['server_cpu_ms_per_session_s']} CPU-ms/session-s, loop lag p99 {s['loop_lag_ms']['p99']} ms, "
              f"probe p50 {s['probe_ms']['p50']} ms, ping p99 {lv['ping_rtt_ms']['p99']} ms", file=sys.stderr, flush=True)
        if spy_out is not None and spy_out.exists():
            lv["gil"] = _gil_top(spy_out, _SPY_RATE_HZ, int(args.seconds))
            gil = {"sessions": n, **lv["gil"]}
            print(f"  c={n}: GIL held {lv['gil']['gil_held_pct']} % of the time", file=sys.stderr, flush=True)
    result = {
        "label": args.label,
        "command": "python -m bench.server_load " + " ".join(sys.argv[1:]),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "frame_ms": _FRAME_MS, "probe_ops": args.probe_ops, "respond": args.respond,
        "levels": results, "gil": gil,
    }
    (out / "server_load.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "server_load.md").write_text(_markdown(result))
    print(_markdown(result))


def compare(folders: list[str]) -> str:
    """Medians over repeated runs: each folder's `server_load.json`, grouped by label less a trailing `-<rep>`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for folder in folders:
        result = json.loads((Path(folder) / "server_load.json").read_text())
        groups.setdefault(re.sub(r"-\d+$", "", result["label"]), []).append(result)

    def med(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return round(float(np.median(kept)), 2) if kept else None

    lines = [("| arm | runs | sessions | server CPU ms/s | net CPU ms / session-s | loop lag p99 ms | probe ms p50 / p99 "
              "| probe wait p50 / p99 ms | ping RTT p50 / p99 ms |"), "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for arm, runs in groups.items():
        levels = sorted({lv["sessions"] for r in runs for lv in r["levels"]})
        for n in levels:
            rows = [(r, lv) for r in runs for lv in r["levels"] if lv["sessions"] == n]

            def net(r: dict[str, Any], lv: dict[str, Any], n: int = n) -> float | None:
                idle = next((x for x in r["levels"] if x["sessions"] == 0), None)
                if not n or idle is None or not lv["audio_s_per_s"]:
                    return None
                return (lv["server"]["cpu_ms_per_s"] - idle["server"]["cpu_ms_per_s"]) / lv["audio_s_per_s"]

            def get(*keys: str, rows: list = rows) -> float | None:
                return med([_dig(lv, keys) for _, lv in rows])

            lines.append(
                f"| {arm} | {len(rows)} | {n} | {get('server', 'cpu_ms_per_s')} | {med([net(r, lv) for r, lv in rows])} | "
                f"{get('server', 'loop_lag_ms', 'p99')} | {get('server', 'probe_ms', 'p50')} / {get('server', 'probe_ms', 'p99')} | "
                f"{get('server', 'probe_wait_ms', 'p50')} / {get('server', 'probe_wait_ms', 'p99')} | "
                f"{get('ping_rtt_ms', 'p50')} / {get('ping_rtt_ms', 'p99')} |")
    return "\n".join(lines) + "\n"


def _dig(value: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.server_load", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "serve", "compare"])
    p.add_argument("folders", nargs="*", help="(compare) result folders: medians per label, less its -<rep>")
    p.add_argument("--sessions", default="0,8,16,32", help="comma-separated session counts (0 = idle baseline)")
    p.add_argument("--seconds", type=float, default=15.0, help="measured window per level")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds of load before measuring")
    p.add_argument("--silence-s", type=float, default=2.0, help="silence after each spoken turn in the loop")
    p.add_argument("--respond", action="store_true", help="turns create responses (the tiny engine's forced reply)")
    p.add_argument("--forced-reply", default="Sure, here it is.")
    p.add_argument("--probe-ops", type=int, default=400, help="tiny torch ops per probe burst")
    p.add_argument("--tick-ms", type=float, default=10.0, help="event-loop lag probe period")
    p.add_argument("--max-sessions", type=int, default=64, help="(serve) server.limits.max_sessions")
    p.add_argument("--override", action="append", default=[], help="server config override key=value (repeatable)")
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="sys.setswitchinterval of the server process (default: the server's own)")
    p.add_argument("--py-spy", action="store_true", help="py-spy record --gil every level (the report details the highest)")
    p.add_argument("--label", default="", help="name for this run in the report")
    p.add_argument("--out", default="bench/out/server-load")
    args = p.parse_args(argv)
    if args.mode == "compare":
        print(compare(args.folders), end="")
    elif args.mode == "serve":  # the server's own loop, as `realtime-ming serve` runs it
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(args))
    else:
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()
