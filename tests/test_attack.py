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
from bench.attack.drain import drain
from bench.attack.flood import flood
from bench.attack.http_bodies import http_bodies
from bench.attack.image_stall import image_stall
from bench.attack.soak import soak
from bench.attack.tools import tools_attack
from bench.attack.voices import voice_eviction, voice_starvation
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.session.runner import AudioPacer

KEYS = [f"key{i:02d}" for i in range(5)]

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(240)]




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


@pytest.fixture
async def keyed(engine):
    """Five API keys sharing a 16-voice store (3 voices each), 2 registration slots and 2 s body deadlines."""
    cfg = load_config(None, ["server.port=0", f"server.auth.api_keys=[{', '.join(KEYS)}]",
                             "server.voices.max_voices=16", "server.voices.max_pending=2",
                             "server.voices.body_timeout_s=2"])
    async with RealtimeServer(cfg, engine) as srv:
        yield srv


async def test_bodiless_uploads_of_one_key_never_refuse_another(keyed):
    """One key holds 6 registrations that send a head and no body: the 4 other keys register at once, 2 at a time
    in the 2 slots (0 429), the holder gets its own 429s (past its 2 pending) and 408s (the body deadline); 0 5xx."""
    report = await voice_starvation(_url(keyed), attacker_key=KEYS[0], victim_keys=KEYS[1:], hold=6)
    assert report["ok"] and report["cross_key_429"] == 0 and report["victims_ok"] == 4, report
    assert report["attacker_statuses"] == {"429": 4, "408": 2}, report


async def test_registrations_past_quota_never_evict_another_keys_voices(keyed):
    """Key 0 registers 2 voices; keys 1-4 register 5 each (past their quota of 3): key 0 keeps both (0 cross-key
    evictions), nobody is refused for another key's sake."""
    report = await voice_eviction(_url(keyed), keys=KEYS, victim_voices=2, per_key=5)
    assert report["ok"] and report["cross_key_evictions"] == 0 and report["registrations"] == {"200": 22}, report
    counts = [len(keyed.voice_routes.store.list(keyed.voice_routes.owner(k))) for k in KEYS]
    assert counts == [2, 3, 3, 3, 3], counts


async def test_odd_request_bodies_on_every_route_never_get_a_5xx(keyed):
    report = await http_bodies(_url(keyed), api_key=KEYS[0], fuzz=200)
    assert report["ok"] and report["http_5xx"] == 0 and report["health_after"] == 200, report
    assert report["unanswered"] == 0, report  # a malformed head gets its 400 too, never a silent close
    assert report["codes"].get("invalid_text", 0) >= 10, report  # the lone surrogates, named as such


async def test_drain_deadline_sends_response_done_before_every_close(server):
    """3 spoken replies running when the drain gives up (0.5 s): each gets response.done (cancelled,
    server_shutting_down) before its 1001 close, nothing after it."""
    report = await drain(_url(server), lambda: server.drain(0.5), sessions=3)
    assert report["ok"] and report["done_before_close"] == 3, report
    assert report["outcomes"] == {"cancelled/server_shutting_down": 3} and report["close_codes"] == {"1001": 3}, report


@pytest.mark.slow
async def test_a_big_image_does_not_stall_other_sessions(server):
    """A 2048 x 2048 image with a reply request while 2 sessions stream replies: their event gap stays <= 1 s."""
    report = await image_stall(_url(server), side=2048, sessions=2, max_gap_s=1.0)
    assert report["ok"], report


async def test_oversized_tools_are_refused_where_they_come_in(server):
    """128 tools at every size limit (~9.4 MB a frame), by session.update and by response.create, twice: both are
    refused as control frames over their cap (event_frame_too_large at `type`: the response.create carries no media),
    no response starts, another session's turns complete and /health answers throughout (issue 43; the full run's
    latency ratios: `python -m bench.attack tools`)."""
    report = await asyncio.to_thread(asyncio.run, tools_attack(_url(server), attacks=2, turns=3))
    assert report["refused_where_sent"], report
    assert report["answers"] == {"event_frame_too_large@type": 4}, report
    assert report["attack"]["health_n"] >= 5 and report["attack"]["health_failures"] == 0, report
