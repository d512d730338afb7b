"""Tensor-parallel shutdown is bounded (gloo, two CPU ranks): a clean close releases every graphed step object
before any rank leaves the process group (NCCL cannot destroy a communicator that captured graphs still pin),
workers acknowledge by exiting 0, and a stuck or dead worker cannot make `close` hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from server_support import seconds

from realtime_ming.engine import tp as tp_module
from realtime_ming.engine.thinker_decode import ThinkerDecoder
from realtime_ming.engine.thinker_prefill import ThinkerPrefiller
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.thinker import ThinkerKVCache

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _start(fixture_root):
    ck = load_checkpoint_config(fixture_root)
    proxy = tp_module.start_tp(ck, ("cpu", "cpu"), str(fixture_root), torch.float32, 0, 2, 64)
    cache = ThinkerKVCache.allocate(ck.thinker, 2, 64, device="cpu", dtype=torch.float32, tp=proxy.tp)
    return proxy, cache


def _one_call(proxy) -> None:
    """A published call every rank runs (proves the workers are serving)."""
    out = proxy.embed(torch.tensor([[1, 2, 3]]))
    assert out.shape[:2] == (1, 3)


def test_clean_close_releases_graphs_before_leaving_and_workers_acknowledge(fixture_root, monkeypatch):
    order: list[str] = []
    destroy = dist.destroy_process_group
    monkeypatch.setattr(ThinkerDecoder, "release", lambda self: order.append("decoder released"))
    monkeypatch.setattr(ThinkerPrefiller, "release", lambda self: order.append("prefiller released"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: (order.append("left group"), destroy(*a, **k)))
    proxy, cache = _start(fixture_root)
    procs = list(proxy.procs)
    proxy.decoder(cache, (1, 2), (64,))
    proxy.prefiller(cache, (16,))
    _one_call(proxy)
    proxy.close()
    assert order == ["decoder released", "prefiller released", "left group"]
    assert [p.exitcode for p in procs] == [0]  # the worker released its own graphs, left its group, exited 0
    assert not dist.is_initialized() and proxy.procs == []
    proxy.close()  # idempotent


def test_close_is_bounded_when_a_worker_is_stuck(fixture_root):
    """A worker that never takes the stop message (stopped by SIGSTOP, like one wedged in a driver call) is
    terminated, then killed, after the deadline: close returns (a close that waited for it would hang until the
    test's timeout), the worker ends by SIGKILL, rank 0 has left its group; the next start works."""
    proxy, _ = _start(fixture_root)
    _one_call(proxy)
    worker = proxy.procs[0]
    os.kill(worker.pid, signal.SIGSTOP)
    proxy.close(timeout_s=2.0)
    assert not worker.is_alive() and worker.exitcode == -signal.SIGKILL
    assert not dist.is_initialized()
    again, _ = _start(fixture_root)
    try:
        _one_call(again)
    finally:
        again.close()
    assert not dist.is_initialized()


def test_close_after_a_worker_died_is_prompt_and_leaves_the_group(fixture_root):
    proxy, _ = _start(fixture_root)
    _one_call(proxy)
    worker = proxy.procs[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(5)
    proxy.close()
    assert not dist.is_initialized() and proxy.procs == []


def test_workers_exit_when_rank0_dies(fixture_root):
    """Rank 0's process killed outright before it joined the group: its worker, waiting in the rendezvous (which
    would wait for 30 minutes), notices the lost parent and exits within seconds instead of holding its GPU."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import multiprocessing, os, sys, time, torch\n"
        "from realtime_ming.engine import tp\n"
        "from realtime_ming.model.config import load_checkpoint_config\n"
        "def die(rank, launch):\n"
        "    (worker,) = multiprocessing.active_children()\n"
        "    print(worker.pid, flush=True)\n"
        "    time.sleep(3)\n"
        "    os.kill(os.getpid(), 9)\n"
        "tp._init = die\n"
        "root = sys.argv[1]\n"
        "tp.start_tp(load_checkpoint_config(root), ('cpu', 'cpu'), root, torch.float32, 0, 2, 64)\n"
    )
    repo = Path(__file__).resolve().parent.parent
    rank0 = subprocess.Popen([sys.executable, "-c", script, str(fixture_root)], cwd=repo, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    pid = int(rank0.stdout.readline())
    rank0.stdout.close()  # the worker inherited this pipe: never wait for its end
    assert rank0.wait(60) == -signal.SIGKILL
    # The worker notices on its own (it polls its parent); the bound only keeps a broken one from hanging the run.
    deadline = time.monotonic() + seconds(120.0)
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"worker {pid} outlived its killed rank 0")


def test_exit_now_flushes_then_skips_interpreter_finalization():
    """How a worker that left its group ends (`_exit.exit_now`, also the served CLI's end): its exit code is its
    acknowledgement, so the interpreter's finalization, where torch's distributed teardown can still abort
    (SIGABRT, seen once in CI after a clean gloo leave), is skipped; what it wrote and logged is flushed first."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import atexit, logging, sys\n"
        "from realtime_ming import _exit\n"
        "logging.basicConfig(stream=sys.stderr, format='%(message)s')\n"
        "atexit.register(lambda: print('finalized', flush=True))\n"
        "sys.stdout.write('unflushed ')\n"
        "logging.getLogger('w').error('logged')\n"
        "_exit.exit_now(0)\n"
        "print('after exit')\n"
    )
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "unflushed "  # flushed; no atexit handler, nothing after the exit
    assert done.stderr.strip() == "logged"
