"""Short CI versions of the bench/attack drivers against an in-process server (tiny model, CPU, loopback).

Full sizes: `python -m bench.attack ...` (bench/attack/). The flood's client runs on its own thread
and event loop, so /health is timed as another process would see it.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from server_support import espeak, silence

from bench.attack.barge import barge_ins
from bench.attack.flood import flood
from bench.attack.soak import soak
from bench.attack.tools import tools_attack
from realtime_ming.session.runner import AudioPacer

pytestmark = pytest.mark.timeout(240)




def _url(srv) -> str:
    return f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming"


async def test_audio_flood_keeps_health_fast(server):
    """90 s of audio sent unpaced under server VAD: /health p50 <= 20 ms meanwhile, and the server read it all."""
    report = await asyncio.to_thread(asyncio.run, flood(_url(server), audio_s=90.0, max_p50_ms=20.0))
    assert report["health"]["n"] >= 10, report
    assert report["health"]["failures"] == 0, report
    assert report["health"]["p50_ms"] <= 20.0, report
    assert report["errors"] == 0, report


def test_audio_pacer_allows_a_burst_then_the_rate():
    pacer = AudioPacer(rate=10.0, burst_s=2.0)
    now = 100.0
    pacer._t = now
    assert pacer.delay_s(2000.0, now) == 0.0  # the burst
    assert pacer.delay_s(1000.0, now) == pytest.approx(0.1)  # 1 s of audio at 10x real time
    # 0.1 s later 1 s of credit came back (10x): it pays the 1 s owed, the next second waits 0.1 s again
    assert pacer.delay_s(1000.0, now + 0.1) == pytest.approx(0.1)
    assert AudioPacer(rate=0.0, burst_s=0.0).delay_s(1e6, now) == 0.0  # unpaced


async def test_barge_ins_never_fail(server):
    """100 replies cancelled mid-stream over 4 concurrent sessions: 0 failed, 0 late deltas."""
    report = await barge_ins(_url(server), total=100, sessions=4)
    assert report["ok"], report
    assert report["barge_ins"] >= 90, report


async def test_speech_barge_ins_never_fail(server, tmp_path):
    """Speech over a reply under server VAD: the reply ends cancelled, never failed."""
    speech = espeak("Wait, stop talking please.", tmp_path)
    audio = np.concatenate([speech, silence(0.8)])
    report = await barge_ins(_url(server), total=4, sessions=2, mode="speech", speech=audio)
    assert report["ok"], report


async def test_session_soak_keeps_fds_and_rss_flat(server):
    """100 sessions of one turn each: open fds and RSS of the server process do not grow."""
    report = await soak(_url(server), sessions=100, concurrency=8, warmup=16, pid=os.getpid(),
                        settle=lambda: asyncio.wait_for(server.wait_idle(), 30), max_rss_growth_mib=64.0,
                        max_fd_growth=4)
    assert report["ok"], report


async def test_oversized_tools_are_refused_where_they_come_in(server):
    """128 tools at every size limit (~9.4 MB a frame), by session.update and by response.create, twice: each is
    refused with instructions_exceed_context at its param, no response starts, another session's turns complete
    and /health answers throughout (issue 43; the full run's latency ratios: `python -m bench.attack tools`)."""
    report = await asyncio.to_thread(asyncio.run, tools_attack(_url(server), attacks=2, turns=3))
    assert report["refused_where_sent"], report
    assert report["attack"]["health_n"] >= 5 and report["attack"]["health_failures"] == 0, report
