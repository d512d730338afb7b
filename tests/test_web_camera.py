"""The demo's camera button in headless Chromium (fake camera and microphone, issue 19).

The fake microphone plays espeak-ng speech; with the camera on, the page sends downscaled JPEG
frames as `input_image` items from speech_started to speech_stopped. The server's engine (the
tiny model speaking a forced reply, behind a recording wrapper) must get a reply request whose
prompt holds those camera frames, in order, before the spoken turn's audio, and the reply is played.
"""

from __future__ import annotations

import numpy as np
import pytest
from browser_support import FORCED_REPLY, MIC_RATE_HZ, _mic_file, _open, _page, _wait_for
from conftest import tiny_engine_fixture
from server_support import RecordingEngine, espeak

from realtime_ming.engine.api import ContentKind
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.browser, pytest.mark.timeout(300)]


# the tiny engine speaking test_web's forced reply (its own random text is often unspeakable)
engine = tiny_engine_fixture(forced_reply=FORCED_REPLY)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("Look at this, what do you see here?", tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


async def test_web_camera_frames_go_with_a_spoken_turn(engine, speech, tmp_path):
    recording = RecordingEngine(engine)
    mic = _mic_file(tmp_path, speech, gap_s=8.0)
    config = load_config(None, ["server.port=0", "session.max_output_tokens=16"])
    async with RealtimeServer(config, recording) as srv, _page(mic) as page:
        await _open(page, srv)
        await page.click("#connect-btn")
        await _wait_for(page, "() => __demo.state === 'listening'", 30)
        await page.click("#camera-btn")
        await _wait_for(page, "() => __demo.cameraOn", 10)
        # A turn with camera frames has ended: the page mutes itself at once, so the looping mic's next
        # sentence cannot cancel that turn's reply however slowly this machine encodes the frames.
        await _wait_for(page, """() => __demo.speechStopped === __demo.speechStarted
                 && Object.values(__demo.cameraFramesBySpeech).some(n => n > 0)
                 && (document.getElementById('mute-btn').click(), true)""", 60)
        await _wait_for(page, """() => Object.values(__demo.responses).some(r => FINISHED.includes(r.status)
                 && r.audioDeltas > 0)""", 180)
        demo = await page.evaluate("window.__demo")
        pressed = await page.get_attribute("#camera-btn", "aria-pressed")
        preview_shown = await page.is_visible("#camera-preview")
    assert pressed == "true" and preview_shown
    assert demo["errors"] == [] and page.errors == [] and "cameraError" not in demo
    spoken = {item: n for item, n in demo["cameraFramesBySpeech"].items() if n > 0}
    assert demo["sent"]["conversation.item.create"] == demo["cameraFrames"] >= sum(spoken.values())
    replies = [r for r in recording.requests if r.task.value == "reply"]
    assert replies, "no reply request reached the engine"
    history = replies[-1].history  # the reply to the turn spoken with the camera on (then muted)
    kinds = [tuple(c.kind for c in m.content) for m in history]
    assert kinds[-1] == (ContentKind.AUDIO,)  # that turn's speech
    first_frame = len(kinds) - 1
    while first_frame > 0 and kinds[first_frame - 1] == (ContentKind.IMAGE,):
        first_frame -= 1
    assert first_frame < len(kinds) - 1  # the frames sent while the user spoke come right before the spoken turn
    frame = history[first_frame].content[0].image
    assert frame.ndim == 3 and max(frame.shape[:2]) <= 512  # the page downscales frames before sending
