"""The browser demo (realtime_ming/web/) in headless Debian Chromium against the real server and tiny engine.

Chromium's fake microphone plays espeak-ng speech (`--use-file-for-fake-audio-capture`). What is
asserted is what the page itself observed and shows (`window.__demo`, the DOM): server-VAD turns,
audio deltas played out by the playback worklet, TTFA, a barge-in that stops playback, truncates
to the played length and sees the response cancelled, the error banners, typed and image turns,
and the shared worklet resampler against soxr.
"""

from __future__ import annotations

import base64
import os
import socket
from contextlib import asynccontextmanager

import numpy as np
import pytest
import soxr
from browser_support import (
    FINISHED,
    FORCED_REPLY,
    MIC_RATE_HZ,
    OUTPUT_RATE_HZ,
    SCREENSHOT_ENV,
    _mic_file,
    _ms,
    _open,
    _page,
    _wait_for,
)
from conftest import tiny_engine_fixture
from server_support import StubEngine, espeak

from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.browser, pytest.mark.timeout(300)]

# the real engine on the embedded tiny default (every model computation runs), speaking FORCED_REPLY
engine = tiny_engine_fixture(forced_reply=FORCED_REPLY)


@pytest.fixture(scope="module")
def stub_engine():
    """A scripted engine for tests that need a server but no model output."""
    eng = StubEngine()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """About 1.3 s of espeak-ng speech at the fake microphone's 48 kHz."""
    return espeak("What time is it now?", tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


@asynccontextmanager
async def _server(engine, *overrides: str):
    async with RealtimeServer(load_config(None, ["server.port=0", *overrides]), engine) as srv:
        yield srv


async def test_web_spoken_turn_is_played_and_timed(engine, speech, tmp_path):
    """Fake-mic speech: a server-VAD turn, a finished reply whose every received sample the worklet
    played, states listening → user speaking → thinking → speaking → listening, and the TTFA shown."""
    mic = _mic_file(tmp_path, speech, gap_s=8.0)
    async with _server(engine, "session.max_output_tokens=32") as srv, _page(mic) as page:
        await _open(page, srv)
        await page.click("#connect-btn")
        # One turn is enough: the page mutes itself at its speech_stopped, so the looping mic's next
        # sentence cannot cancel the reply however slowly this machine answers.
        await _wait_for(page, "() => __demo.speechStopped >= 1 && (document.getElementById('mute-btn').click(), true)", 60)
        await _wait_for(page, """() => __demo.playback.state === 'idle' && Object.values(__demo.responses).some(
                 r => FINISHED.includes(r.status) && r.audioDeltas > 0 && r.playedSamples === r.receivedSamples)""", 180)
        demo = await page.evaluate("window.__demo")
        ttfa_text = await page.text_content("#ttfa-value")
        chart_label = await page.get_attribute("#latency-chart", "aria-label")
        bubbles = await page.locator(".msg-assistant").count()
        await _wait_for(page, "() => Object.keys(__demo.transcripts).length > 0", 60)
        demo = await page.evaluate("window.__demo")
        user_bubbles = await page.locator(".msg-user .msg-body").all_text_contents()
    played = [r for r in demo["responses"].values() if r["status"] in FINISHED and r["audioDeltas"] > 0]
    reply = played[0]
    assert demo["speechStarted"] >= 1 and demo["speechStopped"] >= 1 and demo["committed"] >= 1
    assert demo["outputRate"] == OUTPUT_RATE_HZ
    assert demo["sent"]["input_audio_buffer.append"] >= 50  # at least a second of 20 ms frames
    assert reply["playedSamples"] == reply["receivedSamples"] > 0
    assert demo["events"]["response.output_audio.delta"] >= reply["audioDeltas"]
    assert demo["ttfaMs"] and all(ms > 0 for ms in demo["ttfaMs"])
    assert ttfa_text == f"{demo['ttfaMs'][-1]} ms"
    assert f"latest {demo['ttfaMs'][-1]} ms" in chart_label
    assert bubbles >= 1
    # the user's words come from Ming's own ASR (random text with the tiny model) and fill their bubble
    assert demo["transcripts"] and None not in demo["transcripts"].values()
    assert any(t.strip() and t.strip() in bubble for t in demo["transcripts"].values() for bubble in user_bubbles)
    log = demo["stateLog"]
    flow = ["listening", "user_speaking", "thinking", "speaking", "listening"]
    positions = [log.index(flow[0])]
    for state in flow[1:]:
        positions.append(log.index(state, positions[-1] + 1))
    assert positions == sorted(positions)
    assert demo["errors"] == [] and page.errors == []


async def test_web_barge_in_stops_playback_and_cancels(engine, speech, tmp_path):
    """The user waits (mic muted) until a long spoken reply plays, then the looping fake mic talks over
    it: playback stops at once (player idle), the item is truncated to exactly the samples played, the
    server acknowledges it and cancels the response (turn_detected).

    Every step waits for the page's own events, not for the mic loop's timing: with the mic live the
    next looped sentence could arrive before the reply's first audio (a slow machine, a late first
    segment), and a reply cancelled before it played, or one whose audio was all played before the
    cut, proves nothing here.
    """
    mic = _mic_file(tmp_path, speech, gap_s=4.0)  # the pause that leaves time to mute after the first turn
    found = """() => __demo.bargeIns.flatMap(b => b.items.map(i => ({...i, playbackState: b.playbackState})))
                 .find(i => { const r = __demo.responses[i.responseId];
                              return r.status === 'cancelled' && r.playedSamples > 0
                                  && __demo.truncated.some(t => t.itemId === i.itemId); })"""
    async with _server(engine) as srv, _page(mic) as page:
        await _open(page, srv)
        await page.click("#connect-btn")
        # The first turn is spoken: mute (the page itself, within 20 ms of speech_stopped, no round trip
        # to this process) so the next looped sentence waits until the reply plays.
        await _wait_for(page, "() => __demo.speechStopped >= 1 && (document.getElementById('mute-btn').click(), true)", 60)
        assert await page.get_attribute("#mute-btn", "aria-pressed") == "true"
        # The reply has played a quarter second and still has audio queued in the player (paced: the server
        # keeps only `output_lead_ms` ahead of the listener, so the queue is short but not empty).
        await _wait_for(page, f"""() => Object.values(__demo.responses).some(r => r.status === 'in_progress'
                 && r.playedSamples >= {OUTPUT_RATE_HZ // 4} && r.receivedSamples > r.playedSamples)""", 120)
        await page.click("#mute-btn")  # unmuted: the looping mic's next sentence talks over the reply
        # (on a machine whose talker falls behind real time the player may still drain first: nothing is
        # left to truncate then, and a later reply, talked over in turn, is the one cut)
        handle = await _wait_for(page, found, 120)
        cut = await handle.json_value()
        demo = await page.evaluate("window.__demo")
        if os.environ.get(SCREENSHOT_ENV):
            # README picture: the reply to the interrupting turn half a second into playback.
            await page.set_viewport_size({"width": 1280, "height": 960})
            await _wait_for(page, """() => __demo.state === 'speaking' && Object.values(__demo.responses)
                     .some(r => r.status === 'in_progress' && r.playedSamples > 22050)""", 60)
            await page.screenshot(path=os.environ[SCREENSHOT_ENV])
    reply = demo["responses"][cut["responseId"]]
    assert (reply["status"], reply["reason"]) == ("cancelled", "turn_detected")
    assert cut["playbackState"] == "idle"
    assert cut["audioEndMs"] == reply["playedSamples"] * 1000 // OUTPUT_RATE_HZ
    assert cut["audioEndMs"] <= cut["receivedMs"]
    assert {"itemId": cut["itemId"], "audioEndMs": cut["audioEndMs"]} in demo["truncated"]
    assert demo["speechStarted"] >= 2
    assert demo["errors"] == [] and page.errors == []


async def test_web_banners_auth_and_unreachable(stub_engine):
    """Wrong key: 'Authentication failed' banner, still disconnected; the right key (subprotocol)
    connects; an address with no server: 'Server unreachable'."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    async with _server(stub_engine, "server.auth.api_keys=[s3cret-key]") as srv, _page() as page:
        await _open(page, srv)
        await page.fill("#api-key", "wrong-key")
        await page.click("#connect-btn")
        await page.wait_for_selector("#banner:not([hidden])", timeout=_ms(10))
        auth_title = await page.text_content("#banner-title")
        state_after_refusal = await page.evaluate("__demo.state")
        await page.fill("#api-key", "s3cret-key")
        await page.click("#connect-btn")
        await _wait_for(page, "() => __demo.state === 'listening'", 10)
        pill = await page.text_content("#conn-text")
        banner_hidden = await page.is_hidden("#banner")
        await page.click("#connect-btn")  # disconnect
        await _wait_for(page, "() => __demo.state === 'disconnected'", 10)
        await page.fill("#server-url", f"http://127.0.0.1:{closed_port}")
        await page.click("#connect-btn")
        await page.wait_for_selector("#banner:not([hidden])", timeout=_ms(10))
        unreachable_title = await page.text_content("#banner-title")
    assert (auth_title, state_after_refusal) == ("Authentication failed", "disconnected")
    assert (pill, banner_hidden) == ("Connected", True)
    assert unreachable_title == "Server unreachable"


async def test_web_mic_denied_still_types_and_attaches_images(engine, tmp_path):
    """Microphone denied: a 'Microphone blocked' warning, the session stays up; an attached image is
    accepted by the server and a typed message gets a spoken reply that is played."""
    from PIL import Image

    image_path = tmp_path / "red.png"
    Image.new("RGB", (64, 48), (220, 40, 40)).save(image_path)
    async with _server(engine, "session.max_output_tokens=16") as srv, _page(grant_mic=False) as page:
        await _open(page, srv)
        await page.click("#connect-btn")
        await page.wait_for_selector("#banner:not([hidden])", timeout=_ms(10))
        mic_title = await page.text_content("#banner-title")
        await page.set_input_files("#image-input", str(image_path))
        await page.wait_for_selector(".msg-image", timeout=_ms(10))
        await page.fill("#composer-input", "What colour is this picture?")
        await page.press("#composer-input", "Enter")
        await _wait_for(page, "() => Object.values(__demo.responses).some(r => FINISHED.includes(r.status) && r.playedSamples > 0)", 120)
        demo = await page.evaluate("window.__demo")
    assert mic_title == "Microphone blocked" and demo["micError"] == "denied"
    assert demo["state"] != "disconnected"
    assert demo["sent"]["conversation.item.create"] == 2 and demo["sent"]["response.create"] == 1
    assert demo["events"]["conversation.item.done"] >= 2  # image item and text item accepted
    assert len(demo["ttfaMs"]) == 1
    assert demo["errors"] == [] and page.errors == []


class _RealModelStub(StubEngine):
    """A stub that reports a real checkpoint (no tiny-model notice expected)."""

    def info(self) -> dict:
        return {**super().info(), "is_tiny_default": False}


UNICODE_WORDS = ("Grüße, ", "日本語と", "emoji 🎉 ", "ÀÉÎÕÜ ñ ß.")


async def test_web_tiny_model_notice_and_unicode_transcript():
    """The embedded tiny model (`is_tiny_default` in /v1/models) gets a visible 'random noise' notice
    that a real model does not; multi-byte text deltas (accents, CJK, emoji) show in the transcript
    exactly as sent, with no mojibake."""
    tiny = StubEngine(words=UNICODE_WORDS)
    real = _RealModelStub()
    try:
        async with _server(tiny) as srv, _page(grant_mic=False) as page:
            await _open(page, srv)
            notice_visible = await page.is_visible("#model-notice")
            notice_text = await page.text_content("#model-notice")
            await page.click("#connect-btn")
            await _wait_for(page, "() => __demo.state !== 'connecting' && __demo.state !== 'disconnected'", 10)
            await page.fill("#composer-input", "Say something in several scripts.")
            await page.press("#composer-input", "Enter")
            await _wait_for(page, "() => Object.values(__demo.responses).some(r => r.status === 'completed')", 30)
            shown = await page.locator(".msg-assistant .msg-body").last.text_content()
            still_visible = await page.is_visible("#model-notice")
            demo = await page.evaluate("window.__demo")
            page_errors = list(page.errors)
        async with _server(real) as srv, _page(grant_mic=False) as page:
            await _open(page, srv)
            real_notice_hidden = await page.is_hidden("#model-notice")
            page_errors += page.errors
    finally:
        tiny.close()
        real.close()
    assert notice_visible and still_visible and demo["isTinyModel"] is True
    assert "random noise" in notice_text and "--model-path" in notice_text
    assert shown == "".join(UNICODE_WORDS)
    reply = next(r for r in demo["responses"].values() if r["status"] == "completed")
    assert reply["transcript"] == "".join(UNICODE_WORDS)
    assert real_notice_hidden
    assert page_errors == []


RESAMPLE_SCRIPT = """async ([inHz, outHz, b64]) => {
  const { StreamResampler } = await import('/js/worklets/resampler.js');
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const x = new Float32Array(bytes.buffer);
  const whole = new StreamResampler(inHz, outHz);
  const a = [...whole.push(x), ...whole.flush()];
  const chunked = new StreamResampler(inHz, outHz);
  const b = [];
  for (let i = 0, k = 1; i < x.length; k++) {
    const size = Math.min(x.length - i, (k * 37) % 300 + 1);
    b.push(...chunked.push(x.subarray(i, i + size)));
    i += size;
  }
  b.push(...chunked.flush());
  return [a, b];
}"""


async def test_web_resampler_matches_soxr(stub_engine):
    """The worklets' streaming resampler, fed in uneven chunks, equals its one-shot output exactly
    and soxr VHQ within 1e-3 (2 + 5 kHz tones, 64 edge samples excluded), for each rate pair used."""
    pairs = [(48000, 24000), (44100, 24000), (24000, 44100), (44100, 48000)]
    results = {}
    async with _server(stub_engine) as srv, _page() as page:
        await page.goto(f"http://127.0.0.1:{srv.port}/")
        for in_hz, out_hz in pairs:
            t = np.arange(in_hz // 4) / in_hz
            x = (0.4 * np.sin(2 * np.pi * 2000 * t) + 0.3 * np.sin(2 * np.pi * 5000 * t)).astype(np.float32)
            whole, chunked = await page.evaluate(RESAMPLE_SCRIPT, [in_hz, out_hz, base64.b64encode(x.tobytes()).decode()])
            results[in_hz, out_hz] = (x, np.asarray(whole), np.asarray(chunked))
    for (in_hz, out_hz), (x, whole, chunked) in results.items():
        reference = soxr.resample(x, in_hz, out_hz, quality="VHQ")
        assert whole.size == chunked.size == -(-x.size * out_hz // in_hz), (in_hz, out_hz)
        assert np.array_equal(whole, chunked), (in_hz, out_hz)
        m = min(whole.size, reference.size)
        error = np.max(np.abs(whole[64 : m - 64] - reference[64 : m - 64]))
        assert error < 1e-3, (in_hz, out_hz, error)
