"""The demo's voice controls in headless Chromium (fake microphone, issue 19): clone, speed, style.

The fake microphone plays espeak-ng speech of the sentence the clone field asks the user to read.
The page records it with "Record 6 s and register" (POST /v1/realtime/voices), selects the new
`voice_…` voice, the speed slider is moved before connecting and the style picker changed after;
then a spoken turn is answered. The server's engine (the tiny model speaking a forced reply, behind
a recording wrapper) must get a reply request spoken in the registered voice (the store's own voice
prompt, not the default preset) with the talker caption of that speed and style, and the page must
play the reply.
"""

from __future__ import annotations

import numpy as np
import pytest
from browser_support import FORCED_REPLY, MIC_RATE_HZ, _mic_file, _open, _page, _wait_for
from conftest import tiny_engine_fixture
from server_support import RecordingEngine, espeak

from realtime_ming.engine.voice_store import CustomVoice
from realtime_ming.model.talker_caption import TalkerCaption
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.browser, pytest.mark.timeout(300)]

SENTENCE = "The quick brown fox jumps over the lazy dog."  # the demo's default clone sentence
SPEED = 1.4
EMOTION = "happy"

engine = tiny_engine_fixture(forced_reply=FORCED_REPLY)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak(SENTENCE, tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


async def test_web_clone_my_voice_then_a_reply_in_it_with_speed_and_style(engine, speech, tmp_path):
    recording = RecordingEngine(engine)
    mic = _mic_file(tmp_path, speech, gap_s=6.0)
    config = load_config(None, ["server.port=0", "session.max_output_tokens=16"])
    async with RealtimeServer(config, recording) as srv, _page(mic) as page:
        await _open(page, srv)
        assert await page.input_value("#clone-text") == SENTENCE
        await page.click("#clone-voice")
        await _wait_for(page, "() => document.getElementById('voice').value.startsWith('voice_')", 60)
        status = await page.text_content("#clone-status")
        voice_id = await page.input_value("#voice")
        # the speed slider before connecting (sent with the first session.update) ...
        await page.eval_on_selector("#speed", f"""el => {{ el.value = '{SPEED}';
            el.dispatchEvent(new Event('input')); el.dispatchEvent(new Event('change')); }}""")
        shown_speed = await page.text_content("#speed-value")
        await page.click("#connect-btn")
        await _wait_for(page, "() => __demo.state === 'listening'", 30)
        # ... the style picker after (its own session.update), before the spoken turn ends
        await page.select_option("#emotion", EMOTION)
        await _wait_for(page, """() => __demo.speechStopped > 0 && __demo.speechStopped === __demo.speechStarted
                 && (document.getElementById('mute-btn').click(), true)""", 60)
        await _wait_for(page, """() => Object.values(__demo.responses).some(r => FINISHED.includes(r.status)
                 && r.audioDeltas > 0 && r.playedSamples > 0)""", 180)
        demo = await page.evaluate("window.__demo")
        stored = srv.voice_routes.store.get(srv.voice_routes.owner(None), voice_id)
    assert status.startswith("Voice ready"), status
    assert shown_speed == f"{SPEED:.2f}×"
    assert demo["errors"] == [] and page.errors == []
    assert stored is not None and stored.prompt_text == SENTENCE and stored.prompt.num_patches > 0
    assert 5.0 <= stored.duration_s <= 7.0  # the page recorded about 6 s
    replies = [r for r in recording.requests if r.task.value == "reply" and r.with_audio]
    assert replies, "no spoken reply request reached the engine"
    reply = replies[-1]
    assert isinstance(reply.voice, CustomVoice) and reply.voice.id == voice_id
    assert reply.voice.prompt is stored.prompt  # the registered voice's own prompt, not the default preset's
    assert reply.caption == TalkerCaption(rate="快速", emotion="高兴").instruction()  # speed > 1, happy
