"""Cold start of the server from a checkpoint on disk: time to ready, read rate, peak host RSS, GPU memory after load.

    python -m bench.cold_start --config CONFIG --model-path DIR --out OUT_DIR [--drop-caches] [--set key=value ...]

Starts `realtime-ming serve --config CONFIG --model-path DIR` (its log in OUT_DIR/server.log) and samples every
0.25 s until GET /health/ready answers 200: the resident memory of the server's whole process tree (TP ranks and
front-end processes included; the sum's peak) and the bytes the tree read from storage (/proc/PID/io read_bytes,
the page cache's hits not counted), with when those reads began and last grew (the load's read phase; what follows
is the rest of start-up: quantisation left over, graph capture, warm-up). Then records nvidia-smi's memory per
GPU, stops the server (SIGINT) and writes OUT_DIR/cold_start.json: seconds to ready, checkpoint GB, GB read from
storage, checkpoint GB / seconds, peak RSS.
`--drop-caches` first empties the page cache (needs root; whether it did is recorded): without it a checkpoint
written or read just before is served from memory, not from the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(_children(p))
    return pids


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _gpu_memory() -> list[dict]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.split(", ") for line in out.strip().splitlines() if line]
    return [{"gpu": int(i), "used_MiB": int(u), "total_MiB": int(t)} for i, u, t in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--model-path", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="server config override key=value")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_bytes = sum(f.stat().st_size for f in args.model_path.rglob("*.safetensors"))
    dropped = _drop_caches() if args.drop_caches else None
    cmd = [sys.executable, "-c", "import sys; from realtime_ming.cli import main; sys.exit(main(sys.argv[1:]))",
           "serve", "--config", args.config, "--model-path", str(args.model_path), "--port", str(args.port)]
    for kv in args.set:
        cmd += ["--set", kv]
    log = open(args.out / "server.log", "w")
    t0 = time.perf_counter()
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    peak_rss, reads, ready_s = 0, {}, None
    read_seen, read_first_s, read_last_s = 0, None, None  # when the tree's storage reads began and last grew
    try:
        while time.perf_counter() - t0 < args.timeout_s:
            pids = _tree(server.pid)
            peak_rss = max(peak_rss, sum(_rss_bytes(p) for p in pids))
            for p in pids:
                reads[p] = max(reads.get(p, 0), _read_bytes(p))
            read_now = sum(reads.values())
            if read_now > read_seen + (64 << 20):  # past imports' and configs' small reads
                read_seen = read_now
                read_last_s = time.perf_counter() - t0
                read_first_s = read_first_s if read_first_s is not None else read_last_s
            if server.poll() is not None:
                break
            if _ready(args.port):
                ready_s = time.perf_counter() - t0
                break
            time.sleep(0.25)
        gpus = _gpu_memory()
        rss_ready = sum(_rss_bytes(p) for p in _tree(server.pid))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.close()
    read = sum(reads.values())
    res = {"config": args.config, "model_path": str(args.model_path), "ready": ready_s is not None,
           "exit_code": server.returncode if ready_s is None else None, "page_cache_dropped": dropped,
           "seconds_to_ready": ready_s and round(ready_s, 1), "checkpoint_GB": round(ckpt_bytes / 1e9, 2),
           "read_from_storage_GB": round(read / 1e9, 2),
           "checkpoint_GBps_to_ready": ready_s and round(ckpt_bytes / 1e9 / ready_s, 2),
           "reads_began_s": read_first_s and round(read_first_s, 1),
           "reads_ended_s": read_last_s and round(read_last_s, 1),
           "read_GBps_while_reading": (read_last_s and read_last_s > read_first_s
                                       and round(read / 1e9 / (read_last_s - read_first_s), 2)) or None,
           "peak_host_rss_GB": round(peak_rss / 1e9, 2), "host_rss_at_ready_GB": round(rss_ready / 1e9, 2),
           "gpu_memory_after_load": gpus}
    (args.out / "cold_start.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    if ready_s is None:
        print(open(args.out / "server.log").read()[-3000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
