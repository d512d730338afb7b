"""The server child of bench/server_load.py (`python -m bench.server_load serve`): the tiny CPU engine served
on the server's own loop, with the instruments inside the process: per-thread and front-end CPU time over the
measured window, event-loop lag, and a probe thread standing in for the engine thread's admission (its wall time
and its own CPU time). It prints its port, then answers `begin` / `end` (the window's stats as one JSON line) /
`quit` on stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["pct", "serve"]

_PROBE_PERIOD_S = 0.05


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds per thread (Python threads by name, a pool's threads summed; native threads such as
    onnxruntime's or torch's as `native`), from /proc/self/task."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(task.name), "native")
        base = re.sub(r"[-_]\d+$", "", re.sub(r"_\d+$", "", name))
        out[base] = out.get(base, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class _Probe(threading.Thread):
    """Stand-in for the engine thread: bursts of tiny torch ops, timed (wall and own CPU)."""

    def __init__(self, ops: int) -> None:
        super().__init__(name="probe", daemon=True)
        import torch

        self._torch = torch
        self._ops = ops
        self.samples: list[tuple[float, float]] = []  # (wall ms, CPU ms) per burst
        self._stop = threading.Event()

    def burst(self) -> None:
        torch = self._torch
        x = torch.zeros(8)
        idx = torch.tensor([1, 3])
        for _ in range(self._ops // 4):  # 4 ops per pass: index, add, slice assign, cat
            y = x[idx] + 1.0
            x[:2] = y
            x = torch.cat((x[2:], x[:2]))
            _ = x.shape[0] + idx.numel()

    def run(self) -> None:
        while not self._stop.wait(_PROBE_PERIOD_S):
            t0, c0 = time.perf_counter(), time.thread_time()
            self.burst()
            self.samples.append(((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3))

    def stop(self) -> None:
        self._stop.set()


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far, from /proc (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


async def serve(args: argparse.Namespace) -> None:
    import torch

    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.hooks import EngineHooks
    from realtime_ming.server import RealtimeServer, load_config

    torch.set_num_threads(1)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    engine = Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply=args.forced_reply))
    overrides = ["server.port=0", f"server.limits.max_sessions={max(args.max_sessions, 1)}", *args.override]
    lags: list[float] = []
    probe = _Probe(args.probe_ops)
    probe.start()
    window: dict[str, Any] = {}
    loop = asyncio.get_running_loop()

    async def ticker() -> None:
        period = args.tick_ms / 1e3
        while True:
            t = time.perf_counter()
            await asyncio.sleep(period)
            lags.append((time.perf_counter() - t - period) * 1e3)

    def begin() -> None:
        lags.clear()
        probe.samples.clear()
        window.update(t=time.perf_counter(), cpu=time.process_time(), threads=_thread_cpu_s(),
                      fronts={pid: _proc_cpu_s(pid) for pid in front_pids})

    def end() -> dict[str, Any]:
        wall = time.perf_counter() - window["t"]
        fronts = [round((_proc_cpu_s(pid) - c0) * 1e3 / wall, 1) for pid, c0 in window["fronts"].items()]
        cpu = time.process_time() - window["cpu"] + sum(fronts) * wall / 1e3  # the engine's process + front ends'
        after = _thread_cpu_s()
        threads = {k: round((v - window["threads"].get(k, 0.0)) * 1e3 / wall, 1) for k, v in after.items()}
        walls = [w for w, _ in probe.samples]
        waits = [w - c for w, c in probe.samples]
        return {
            "wall_s": round(wall, 3),
            "cpu_ms_per_s": round(cpu * 1e3 / wall, 1),
            # server.frontend_processes >= 2: each front end's CPU; the threads, loop lag and probe below are then
            # the engine process's (the probe still stands in for the engine thread; no WebSocket runs there)
            "frontend_cpu_ms_per_s": fronts,
            "thread_cpu_ms_per_s": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v >= 1.0},
            "loop_lag_ms": {"p50": pct(lags, 50), "p99": pct(lags, 99), "max": round(max(lags), 3) if lags else None,
                            "n": len(lags)},
            "probe_ms": {"p50": pct(walls, 50), "p99": pct(walls, 99), "max": round(max(walls), 3) if walls else None,
                         "n": len(walls)},
            "probe_wait_ms": {"p50": pct(waits, 50), "p99": pct(waits, 99)},
        }

    def commands() -> None:  # stdin: "begin" / "end" (answered with one JSON line) / "quit"
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "begin":
                loop.call_soon_threadsafe(begin)
            elif cmd == "end":
                fut = asyncio.run_coroutine_threadsafe(asyncio.sleep(0, end()), loop)
                print(json.dumps({"stats": fut.result()}), flush=True)
            elif cmd == "quit":
                break
        loop.call_soon_threadsafe(done.set)

    done = asyncio.Event()
    cfg = load_config(None, overrides)
    front_pids: list[int] = []

    async def serve_until_quit(port: int) -> None:
        tick = asyncio.create_task(ticker())
        threading.Thread(target=commands, daemon=True, name="bench-stdin").start()
        print(json.dumps({"port": port, "pid": os.getpid(), "switch_interval_s": sys.getswitchinterval(),
                          "frontend_pids": front_pids}), flush=True)
        await done.wait()
        tick.cancel()

    if cfg.server.frontend_processes > 1:  # the engine (and the probe) here, the WebSockets in front-end processes
        import secrets
        import tempfile

        from realtime_ming.server.engine_host import EngineHost
        from realtime_ming.server.frontends import FrontEnds
        from realtime_ming.server.startup import open_listener

        folder = tempfile.mkdtemp(prefix="server-load-")
        host = EngineHost(engine, os.path.join(folder, "engine.sock"), secrets.token_bytes(16), cfg.server.voices,
                          cfg.server.limits.max_sessions)
        host.start()
        sock = open_listener("127.0.0.1", 0)
        fronts = FrontEnds(cfg, sock, host)
        await asyncio.to_thread(fronts.start)
        front_pids += fronts.pids
        try:
            await serve_until_quit(sock.getsockname()[1])
        finally:
            await asyncio.to_thread(fronts.stop)
            host.close()
            shutil.rmtree(folder, ignore_errors=True)
    else:
        async with RealtimeServer(cfg, engine) as srv:
            await serve_until_quit(srv.port)
    probe.stop()
    engine.close()
