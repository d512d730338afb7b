"""Headless Chromium for the browser tests: the page, its fake microphone, waits that explain a timeout.

`_page(mic_wav)` starts Debian's Chromium (skipped, naming it, when it is not installed) with a fake microphone
playing `mic_wav` in a loop and a fake camera; `_open(page, srv, transport)` loads the demo from the server;
`_wait_for` waits on the page and, on a timeout, fails with what the page saw.
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from server_support import seconds

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "DEMO_SUMMARY", "FINISHED", "FORCED_REPLY", "MIC_RATE_HZ", "OUTPUT_RATE_HZ", "SCREENSHOT_ENV",
           "_mic_file", "_ms", "_open", "_page", "_wait_for"]

CHROMIUM = Path(os.environ.get("REALTIME_MING_CHROMIUM", "/usr/bin/chromium"))
FINISHED = ("completed", "incomplete")
SCREENSHOT_ENV = "REALTIME_MING_SCREENSHOT"  # set to a path to save the README screenshot there
MIC_RATE_HZ = 48000
OUTPUT_RATE_HZ = 44100  # the page asks for the model's native rate
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-device-for-media-stream",
]


# What the thinker says (cycled until max_output_tokens). The tiny model's own random text holds few
# whitespace words and sentence ends, so how soon its segmenter hands the talker a first segment — and
# whether a reply is spoken at all — was chance; with real words every reply speaks from its first sentence.
FORCED_REPLY = "Sure, here is a long answer. It goes on sentence after sentence, so there is time to talk over it. "


def _ms(value_s: float) -> float:
    """Playwright timeouts are in ms; scaled like every other wait in the tests."""
    return seconds(value_s) * 1000.0


def _mic_file(folder: Path, speech: np.ndarray, gap_s: float) -> str:
    """A looping fake-microphone WAV (48 kHz mono PCM16): 0.3 s silence, the speech, `gap_s` silence."""
    path = folder / f"mic_{gap_s:g}s.wav"
    silence = np.zeros(round(0.3 * MIC_RATE_HZ), np.float32)
    gap = np.zeros(round(gap_s * MIC_RATE_HZ), np.float32)
    sf.write(path, np.concatenate([silence, 0.8 * speech, gap]), MIC_RATE_HZ, subtype="PCM_16")
    return str(path)


@asynccontextmanager
async def _page(mic_wav: str | None = None, *, grant_mic: bool = True):
    """A fresh headless Chromium page; `mic_wav` feeds the fake microphone (looped)."""
    playwright_api = pytest.importorskip("playwright.async_api")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} not found (apt-get install -y chromium)")
    args = list(CHROMIUM_ARGS)
    if grant_mic:
        args.append("--use-fake-ui-for-media-stream")
    if mic_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={mic_wav}")
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            page.errors = []
            page.on("pageerror", lambda exc: page.errors.append(str(exc) + " " + (exc.stack or "")))
            yield page
        finally:
            await browser.close()


DEMO_SUMMARY = """() => { try { return {
    state: __demo.state, muted: document.getElementById('mute-btn').getAttribute('aria-pressed'),
    speechStarted: __demo.speechStarted, speechStopped: __demo.speechStopped, playback: __demo.playback,
    responses: Object.fromEntries(Object.entries(__demo.responses).map(([id, r]) => [id.slice(-8),
        [r.status, r.reason, r.audioDeltas, r.receivedSamples, r.playedSamples]])),
    bargeIns: __demo.bargeIns.length, truncated: __demo.truncated.length, errors: __demo.errors,
    stateLog: __demo.stateLog.slice(-12)}; } catch (err) { return String(err); } }"""


async def _wait_for(page, predicate: str, timeout_s: float, arg=None):
    """`page.wait_for_function` on a scaled timeout; a timeout fails with what the page saw so far
    (its responses as [status, reason, deltas, received, played]), not a bare Playwright timeout."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        return await page.wait_for_function(predicate, arg=arg, timeout=_ms(timeout_s), polling=20)
    except PlaywrightTimeout:
        summary = await page.evaluate(DEMO_SUMMARY)
        raise AssertionError(f"waited {seconds(timeout_s):g} s for {predicate.strip()[:200]!r}; the page saw {summary}") from None


async def _open(page, srv, transport: str = "websocket") -> None:
    """Load the demo from the server (with `transport` chosen) and wait until it has listed the model's voices."""
    await page.goto(f"http://127.0.0.1:{srv.port}/?transport={transport}")
    # A reply ends completed, or incomplete when it reaches the (small) max_output_tokens.
    await page.evaluate(f"window.FINISHED = {json.dumps(FINISHED)}")
    await _wait_for(page, "() => Array.isArray(window.__demo.voices)", 10)
