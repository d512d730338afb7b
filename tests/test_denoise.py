"""Input denoiser: WebRTC noise suppression (the webrtc-noise-gain wheel, a declared dependency on Linux)."""

from __future__ import annotations

import numpy as np
import pytest
from server_support import espeak

from realtime_ming.audio.denoise import Denoiser, suppression_level

MODEL_HZ = 16000


def _run(denoiser: Denoiser, x: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([denoiser.process(x[i: i + chunk]) for i in range(0, x.size, chunk)] + [denoiser.flush()])


def _noisy_speech(tmp_path, noise_dbfs: float, speech_db: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    speech = espeak("Can you tell me a quick fact about the moon?", tmp_path, rate_hz=MODEL_HZ) * 10 ** (speech_db / 20)
    rng = np.random.default_rng(0)
    noisy = rng.normal(0, 10 ** (noise_dbfs / 20), speech.size + 2 * MODEL_HZ).astype(np.float32)
    noisy[MODEL_HZ: MODEL_HZ + speech.size] += speech
    return noisy, speech


def _db(a: np.ndarray, b: np.ndarray) -> float:
    return float(20 * np.log10(a.std() / b.std()))


@pytest.mark.parametrize(("far_field", "min_drop_db"), [(False, 15), (True, 10)])
def test_denoiser_keeps_the_sample_count_and_removes_stationary_noise(tmp_path, far_field, min_drop_db):
    """Chunked streaming returns exactly as many samples as it got; white noise at −30 dBFS drops by more
    than 15 dB at full strength (10 dB with far_field's gain control) while the speech keeps most of its energy."""
    noisy, speech = _noisy_speech(tmp_path, -30)
    out = _run(Denoiser(suppression_level(1.0), auto_gain=far_field), noisy, 333)
    assert out.shape == noisy.shape and out.dtype == np.float32
    quiet = slice(MODEL_HZ // 2, MODEL_HZ - 1600)  # noise only, after the suppressor has adapted
    assert _db(noisy[quiet], out[quiet]) > min_drop_db
    talk = slice(MODEL_HZ, MODEL_HZ + speech.size)
    assert out[talk].std() > 0.5 * speech.std()


def test_strength_orders_the_suppression(tmp_path):
    """More strength removes more noise; strength 0 removes almost none (only the high-pass filter runs)."""
    noisy, _ = _noisy_speech(tmp_path, -30)
    quiet = slice(MODEL_HZ // 2, MODEL_HZ - 1600)
    drops = [_db(noisy[quiet], _run(Denoiser(suppression_level(s), auto_gain=False), noisy, 320)[quiet])
             for s in (0.0, 0.5, 1.0)]
    assert drops[0] < 3 < drops[1] < drops[2]


def test_far_field_raises_a_distant_talker(tmp_path):
    """far_field's gain control lifts quiet speech (−40 dBFS) by several dB; near_field leaves its level."""
    noisy, speech = _noisy_speech(tmp_path, -50, speech_db=-20)
    talk = slice(MODEL_HZ + speech.size // 2, MODEL_HZ + speech.size)
    near = _run(Denoiser(suppression_level(1.0), auto_gain=False), noisy, 320)
    far = _run(Denoiser(suppression_level(1.0), auto_gain=True), noisy, 320)
    assert _db(far[talk], noisy[talk]) > 4
    assert abs(_db(near[talk], noisy[talk])) < 4


def test_denoiser_output_does_not_depend_on_chunking(tmp_path):
    """20 ms appends and odd-sized appends give the same audio; a reset starts over identically."""
    speech = espeak("Hello there.", tmp_path, rate_hz=MODEL_HZ)
    denoiser = Denoiser(3, auto_gain=False)
    a = _run(denoiser, speech, 320)
    denoiser.reset()
    b = _run(denoiser, speech, 777)
    np.testing.assert_array_equal(a, b)


def test_suppression_level_maps_strength_to_webrtc_levels():
    """strength 0..1 → levels 0..4, clamped."""
    assert [suppression_level(s) for s in (-1.0, 0.0, 0.25, 0.5, 0.75, 1.0, 2.0)] == [0, 0, 1, 2, 3, 4, 4]
