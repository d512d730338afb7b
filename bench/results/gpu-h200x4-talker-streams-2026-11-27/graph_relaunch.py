"""Scratch: does cudaGraphLaunch block the host when the same graph exec is still running?"""
import time, statistics, torch
x = torch.randn(64, 4096, device="cuda")
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
def body(n_small, n_mm):
    y = x
    for i in range(n_small):
        y = y * 1.0001 + 0.0001
    z = y.to(torch.bfloat16)
    for i in range(n_mm):
        z = z @ w
    return y, z
def capture(n_small, n_mm):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body(n_small, n_mm)
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body(n_small, n_mm)
    g.replay(); torch.cuda.synchronize()
    return g
for n_small, n_mm in [(800, 0), (800, 200), (200, 400)]:
    g1, g2 = capture(n_small, n_mm), capture(n_small, n_mm)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); g1.replay(); b.record(); torch.cuda.synchronize(); gpu = a.elapsed_time(b)
    res = {"idle": [], "same_inflight": [], "other_inflight": [], "same_2back": []}
    for _ in range(20):
        torch.cuda.synchronize(); t = time.perf_counter(); g1.replay(); res["idle"].append(time.perf_counter() - t)
        torch.cuda.synchronize(); g1.replay(); t = time.perf_counter(); g1.replay(); res["same_inflight"].append(time.perf_counter() - t)
        torch.cuda.synchronize(); g1.replay(); t = time.perf_counter(); g2.replay(); res["other_inflight"].append(time.perf_counter() - t)
        torch.cuda.synchronize(); g1.replay(); g2.replay(); t = time.perf_counter(); g1.replay(); res["same_2back"].append(time.perf_counter() - t)
    torch.cuda.synchronize()
    print(f"kernels ~{n_small + n_mm + 1}, graph GPU {gpu:.2f} ms; host ms per replay (median): " +
          ", ".join(f"{k} {1e3 * statistics.median(v):.3f}" for k, v in res.items()), flush=True)
