"""Per-call host cost of the tensor-parallel control plane on rank 0: the pickled call
(`broadcast_object_list`, the former `engine/tp.py` `_publish`) against the fixed-size tensor header
(`engine/tp_wire.py` `Publisher`), for a decode step of B rows (its ints inline) and a prefill chunk
(six tensors). Two processes; rank 1 receives every call.

    python -m bench.tp_control_bench --devices cpu,cpu               # gloo
    python -m bench.tp_control_bench --devices cuda:0,cuda:1         # NCCL (2 GPUs)

Reports the median and p90 of rank 0's wall time per publish, in microseconds, as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realtime_ming._exit import exit_now
from realtime_ming.engine.tp_wire import Publisher, Receiver


def _pickled_publish(method: str, args: tuple, kwargs: dict, device: torch.device) -> None:
    """The former wire: the call pickled with tensors replaced by (shape, dtype), then one broadcast each."""
    tensors: list[torch.Tensor] = []

    def ref(v):
        if not isinstance(v, torch.Tensor):
            return v
        tensors.append(v.to(device).contiguous())
        return ("tensor", len(tensors) - 1, tuple(v.shape), v.dtype)

    dist.broadcast_object_list([(method, tuple(ref(a) for a in args), {k: ref(v) for k, v in kwargs.items()})], src=0)
    for t in tensors:
        dist.broadcast(t, src=0)


def _pickled_receive(device: torch.device) -> None:
    box = [None]
    dist.broadcast_object_list(box, src=0)
    _, args, kwargs = box[0]
    for v in (*args, *kwargs.values()):
        if isinstance(v, tuple) and v and v[0] == "tensor":
            dist.broadcast(torch.empty(v[2], dtype=v[3], device=device), src=0)


def _calls(rows: int, device: torch.device) -> dict[str, tuple[str, tuple, dict]]:
    r, w, d = 2, 64, 256
    prefill = dict(embeds=torch.randn(r, w, d, device=device), rotary=torch.zeros(3, r, w, dtype=torch.int64, device=device),
                   cpos=torch.zeros(r, w, dtype=torch.int64, device=device),
                   slots=torch.zeros(r, dtype=torch.int64, device=device),
                   image_mask=torch.zeros(r, w, dtype=torch.bool, device=device),
                   audio_mask=torch.zeros(r, w, dtype=torch.bool, device=device))
    step = tuple(list(range(rows)) for _ in range(4))
    return {f"decoder_step B={rows}": ("decoder_step", step, {}), "prefiller_step 2x64": ("prefiller_step", (), prefill)}


def _rank(rank: int, devices: list[str], port: int, iters: int, rows: int, out: str) -> None:
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    calls = _calls(rows, device)
    pub, inbox = (Publisher(device), None) if rank == 0 else (None, Receiver(device))
    report = {}
    for name, (method, args, kwargs) in calls.items():
        for wire in ("pickled", "header"):
            times = []
            for _ in range(iters):
                dist.barrier()
                started = time.perf_counter()
                if rank == 0:
                    if wire == "pickled":
                        _pickled_publish(method, args, kwargs, device)
                    else:
                        pub.publish(method, args, kwargs)
                    times.append(time.perf_counter() - started)
                elif wire == "pickled":
                    _pickled_receive(device)
                else:
                    inbox.receive()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rank == 0:
                us = sorted(t * 1e6 for t in times)
                report[f"{name} {wire}"] = {"median_us": round(statistics.median(us), 1),
                                            "p90_us": round(us[int(0.9 * (len(us) - 1))], 1)}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"devices": devices, "iters": iters, "torch": torch.__version__, "per_call": report}, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    exit_now(0)  # finished: interpreter finalization could still abort the rank (torch's thread teardown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cpu", help="two devices, one per rank")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--rows", type=int, default=16, help="decode-step batch")
    parser.add_argument("--out", default="tp_control_bench.json")
    a = parser.parse_args()
    devices = a.devices.split(",")
    if len(devices) != 2:
        parser.error("--devices takes exactly two devices")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(devices, port, a.iters, a.rows, a.out), nprocs=2, join=True)
    with open(a.out) as f:
        print(f.read())


if __name__ == "__main__":
    main()
