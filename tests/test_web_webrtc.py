"""The browser demo over WebRTC in headless Chromium (fake microphone and camera) against the real server.

The page mints an ephemeral key (`POST /v1/realtime/client_secrets`), posts its offer to `/v1/realtime/calls`
and talks over the call: the microphone and the reply as Opus tracks, events on the `oai-events` data channel.
Every data-channel event the page received is validated against the openai package's GA server-event union.
Also here: the demo's layout at common window sizes (the control row once overflowed its card at 1280x900).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from browser_support import FORCED_REPLY, MIC_RATE_HZ, _mic_file, _open, _page, _wait_for
from conftest import tiny_engine_fixture
from realtime_validate import validate_server_event
from server_support import StubEngine, espeak

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(400)]

engine = tiny_engine_fixture(forced_reply=FORCED_REPLY)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("Look at this, what do you see here?", tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


def _validated(frames: list[str]) -> list[dict]:
    events = [json.loads(frame) for frame in frames]
    for event in events:
        validate_server_event(event, Dialect.GA, allow_timings=True, allow_playout=True)
    return events


async def test_web_webrtc_talks_barges_in_and_sends_camera_frames(engine, speech, tmp_path):
    """A spoken turn with the camera on (frames go as input_image items on the data channel), its reply heard
    on the track, then the looping microphone talks over the reply: the server clears its playout and truncates
    the item to what was played. The page sends no audio events: it all travels as Opus."""
    mic = _mic_file(tmp_path, speech, gap_s=4.0)
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv, _page(mic) as page:
        await page.add_init_script("window.__recordFrames = true")
        await _open(page, srv, "webrtc")
        await page.click("#connect-btn")
        await _wait_for(page, "() => __demo.state === 'listening'", 30)
        await page.click("#camera-btn")
        await _wait_for(page, "() => __demo.cameraOn", 10)
        # a turn spoken with camera frames has ended: mute at once, so the reply plays before the next sentence
        await _wait_for(page, """() => __demo.speechStopped === __demo.speechStarted && __demo.speechStopped > 0
                 && Object.values(__demo.cameraFramesBySpeech).some(n => n > 0)
                 && (document.getElementById('mute-btn').click(), true)""", 90)
        await _wait_for(page, "() => __demo.state === 'speaking' && __demo.heardMs >= 1000", 180)
        await page.click("#mute-btn")  # the looping microphone's next sentence talks over the reply
        await _wait_for(page, "() => __demo.cleared.length > 0 && __demo.truncated.length > 0", 120)
        demo = await page.evaluate("window.__demo")
        frames = await page.evaluate("window.__frames")
    events = _validated(frames)
    types = [e["type"] for e in events]
    assert demo["transport"] == "webrtc" and demo["errors"] == [] and page.errors == []
    assert "response.output_audio.delta" not in types and demo["sent"].get("input_audio_buffer.append") is None
    # talks: the user's turn (VAD on the microphone track), a reply heard on the server's track
    assert demo["speechStopped"] >= 1 and demo["heardMs"] >= 1000 and demo["ttfaMs"]
    # camera frames went as input_image items of the spoken turn and were accepted
    images = [e for e in events if e["type"] == "conversation.item.done"
              and any(c.get("type") == "input_image" for c in e["item"].get("content", []))]
    assert len(images) >= 1 and demo["cameraFrames"] >= len(images)
    # barge-in: cleared after speech_started, the heard reply truncated to a position inside its audio
    cleared = demo["cleared"][0]["responseId"]
    started = next(i for i, e in enumerate(events) if e["type"] == "output_audio_buffer.started"
                   and e["response_id"] == cleared)
    cleared_at = next(i for i, e in enumerate(events) if e["type"] == "output_audio_buffer.cleared")
    assert "input_audio_buffer.speech_started" in types[started:cleared_at]
    truncated = next(e for e in events[cleared_at:] if e["type"] == "conversation.item.truncated")
    assert truncated["item_id"] in demo["responses"][cleared]["itemIds"]
    assert truncated["audio_end_ms"] >= 1000
    assert not any(e["type"] == "output_audio_buffer.stopped" and e["response_id"] == cleared for e in events)


@pytest.mark.parametrize("size", [(1280, 900), (1024, 768), (820, 900), (390, 844)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_web_layout_fits_its_window(size):
    """No sideways scroll, and every button of the live card's control row inside its card."""
    stub = StubEngine()
    try:
        async with RealtimeServer(load_config(None, ["server.port=0"]), stub) as srv, _page(grant_mic=False) as page:
            await page.set_viewport_size({"width": size[0], "height": size[1]})
            await _open(page, srv, "webrtc")
            measured = await page.evaluate("""() => {
                const card = document.querySelector('.card.live').getBoundingClientRect();
                const buttons = [...document.querySelectorAll('.live-actions button')].map(b => {
                    const r = b.getBoundingClientRect(); return [b.id, r.left, r.right]; });
                return {scroll: document.documentElement.scrollWidth, inner: innerWidth,
                        card: [card.left, card.right], buttons}; }""")
    finally:
        stub.close()
    assert measured["scroll"] <= measured["inner"], measured
    left, right = measured["card"]
    for button, b_left, b_right in measured["buttons"]:
        assert left <= b_left and b_right <= right, (button, measured)
