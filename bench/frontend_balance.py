"""How `server.frontend_processes` spreads a burst of connections over its front ends.

Starts `python -m realtime_ming.cli serve` (the embedded tiny model, CPU) from `--repo` with N front ends,
then, per burst size, opens that many WebSocket sessions at once (`asyncio.gather`), reads the answering
front end of each (`x-realtime-ming-frontend`), closes them all and waits until the server shows no session
before the next burst. Prints one line per burst and a JSON summary (`--out`):

    python -m bench.frontend_balance --frontends 4 --bursts 4,16,64 --repeats 3 --out result.json
    python -m bench.frontend_balance --repo /path/to/other/checkout ...   # the same bench against other code
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from websockets.asyncio.client import connect

HEADER = "x-realtime-ming-frontend"
_URL = re.compile(r"serving .* on wss?://[^:]+:(\d+)/v1/realtime")


def _start(repo: Path, frontends: int, max_sessions: int) -> tuple[subprocess.Popen, int]:
    command = [sys.executable, "-m", "realtime_ming.cli", "serve", "--port", "0", "--log-level", "WARNING",
               "--set", f"server.frontend_processes={frontends}", "--set", f"server.limits.max_sessions={max_sessions}"]
    proc = subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        match = _URL.search(line)
        if match:
            return proc, int(match.group(1))
    raise RuntimeError(f"the server exited ({proc.wait()}) before serving")


async def _sessions_open(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    return int(json.loads(data.split(b"\r\n\r\n", 1)[1])["sessions"])


async def _burst(port: int, size: int) -> dict[str, int]:
    async def one():
        ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=60)
        await ws.recv()  # session.created: the session is open on its front end
        return ws

    sockets = await asyncio.gather(*(one() for _ in range(size)))
    split = collections.Counter(ws.response.headers[HEADER] for ws in sockets)
    await asyncio.gather(*(ws.close() for ws in sockets))
    deadline = time.monotonic() + 30
    while await _sessions_open(port) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return dict(sorted(split.items()))


async def _run(port: int, frontends: int, bursts: list[int], repeats: int) -> list[dict]:
    results = []
    for size in bursts:
        for rep in range(repeats):
            split = await _burst(port, size)
            counts = [split.get(str(i), 0) for i in range(frontends)]
            results.append({"burst": size, "repeat": rep, "per_frontend": counts, "max": max(counts),
                            "min": min(counts), "fair": size / frontends})
            print(f"burst {size:3d} #{rep}: per front end {counts} (max {max(counts)}, fair {size / frontends:g})",
                  flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--frontends", type=int, default=4)
    parser.add_argument("--bursts", default="4,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    bursts = [int(b) for b in args.bursts.split(",")]
    proc, port = _start(args.repo, args.frontends, max(bursts) + 8)
    try:
        results = asyncio.run(_run(port, args.frontends, bursts, args.repeats))
    finally:
        proc.terminate()
        proc.wait(60)
    if args.out is not None:
        args.out.write_text(json.dumps({"frontends": args.frontends, "repo": str(args.repo), "results": results},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
