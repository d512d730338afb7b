"""VAD backends and the server_vad TurnDetector, on scripted probabilities, noise and espeak-ng speech."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.resample import resample
from realtime_ming.audio.turns import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    TurnState,
)
from realtime_ming.audio.vad import VAD_SAMPLE_RATE_HZ, SileroVad, WebRtcVad, create_silero_session

SR = VAD_SAMPLE_RATE_HZ
MS = SR // 1000


class ScriptedVad:
    """Returns scripted probabilities, one per 10 ms window, whatever the audio."""

    window_num_samples = 160

    def __init__(self, probs: list[float]) -> None:
        self._probs = probs
        self._index = 0

    def speech_prob(self, window: np.ndarray) -> float:
        prob = self._probs[self._index]
        self._index += 1
        return prob

    def reset(self) -> None:
        self._index = 0


class EnergyVad:
    """1.0 for 10 ms windows with RMS above 0.01, else 0.0: an exact stand-in for a real detector."""

    window_num_samples = 160

    def speech_prob(self, window: np.ndarray) -> float:
        return float(np.sqrt(np.mean(window**2)) > 0.01)

    def reset(self) -> None:
        pass


def _run_scripted(probs: list[float], config: TurnDetectorConfig | None = None) -> list:
    detector = TurnDetector(config or TurnDetectorConfig(), ScriptedVad(probs))
    return detector.feed(np.zeros(160 * len(probs), dtype=np.float32))


def _tone(ms: int) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 300 * np.arange(ms * MS) / SR)).astype(np.float32)


def _silence(ms: int) -> np.ndarray:
    return np.zeros(ms * MS, dtype=np.float32)


def _feed_in_chunks(detector: TurnDetector, x: np.ndarray, chunk: int) -> list:
    events = []
    for pos in range(0, x.size, chunk):
        events += detector.feed(x[pos : pos + chunk])
    return events


# --- state machine, exact times -------------------------------------------------------------


def test_turn_detector_pause_resume_stop_exact_times():
    """Tone 800 ms, 150 ms gap, tone 600 ms → Started, Paused, Resumed, Paused, Stopped at exact ms."""
    x = np.concatenate([_silence(1000), _tone(800), _silence(150), _tone(600), _silence(1000)])
    detector = TurnDetector(TurnDetectorConfig(), EnergyVad())
    assert detector.feed(x) == [
        SpeechStarted(audio_start_ms=700, speech_start_ms=1000),
        SpeechPaused(at_ms=1800),
        SpeechResumed(at_ms=1950),
        SpeechPaused(at_ms=2550),
        SpeechStopped(audio_end_ms=3050, speech_end_ms=2550),
    ]
    assert detector.state is TurnState.SILENCE and detector.position_ms == 3550


def test_turn_detector_chunk_size_independent_exact():
    """Feeding 10 ms, 40 ms, 7-sample or one-shot chunks gives identical events."""
    x = np.concatenate([_silence(300), _tone(500), _silence(200), _tone(300), _silence(700)])
    results = [
        _feed_in_chunks(TurnDetector(TurnDetectorConfig(), EnergyVad()), x, chunk)
        for chunk in (10 * MS, 40 * MS, 7, x.size)
    ]
    assert results[0][0] == SpeechStarted(0, 300)
    assert all(r == results[0] for r in results[1:])


def test_turn_detector_ignores_click_shorter_than_min_speech():
    """A 30 ms burst (< min_speech_ms 64) produces no event."""
    x = np.concatenate([_silence(500), _tone(30), _silence(1000)])
    assert TurnDetector(TurnDetectorConfig(), EnergyVad()).feed(x) == []


def test_turn_detector_hysteresis_keeps_speech_between_thresholds():
    """p in [threshold − 0.15, threshold) continues speech; the pause starts at the first p < 0.35."""
    events = _run_scripted([0.9] * 10 + [0.4] * 60 + [0.2] * 60)
    assert events == [
        SpeechStarted(audio_start_ms=0, speech_start_ms=0),
        SpeechPaused(at_ms=700),
        SpeechStopped(audio_end_ms=1200, speech_end_ms=700),
    ]


def test_turn_detector_pending_counts_only_speech_windows():
    """min_speech_ms counts windows with p ≥ threshold; a silent window drops the candidate."""
    assert _run_scripted([0.9] * 6 + [0.1] + [0.0] * 10) == []
    events = _run_scripted([0.0] * 50 + [0.9] * 3 + [0.4] * 10 + [0.9] * 4 + [0.0] * 60)
    assert events[0] == SpeechStarted(audio_start_ms=200, speech_start_ms=500)
    assert events[-1] == SpeechStopped(audio_end_ms=670 + 500, speech_end_ms=670)


def test_turn_detector_without_speculation_emits_no_pause():
    """speculative_pause_ms = 0 disables SpeechPaused / SpeechResumed."""
    events = _run_scripted([0.9] * 20 + [0.0] * 20 + [0.9] * 20 + [0.0] * 60, TurnDetectorConfig(speculative_pause_ms=0))
    assert events == [SpeechStarted(0, 0), SpeechStopped(audio_end_ms=1100, speech_end_ms=600)]


def test_turn_detector_reset_drops_turn_keeps_clock():
    """reset() forgets a started turn (no Stopped follows) while position_ms keeps counting."""
    detector = TurnDetector(TurnDetectorConfig(), EnergyVad())
    assert detector.feed(np.concatenate([_silence(100), _tone(200)])) == [SpeechStarted(0, 100)]
    detector.reset()
    assert detector.state is TurnState.SILENCE
    assert detector.feed(_silence(1000)) == []
    assert detector.position_ms == 1300


def test_turn_detector_config_validation():
    """Bad parameters raise ValueError naming the field."""
    with pytest.raises(ValueError, match="threshold"):
        TurnDetectorConfig(threshold=1.5)
    with pytest.raises(ValueError, match="speculative_pause_ms"):
        TurnDetectorConfig(speculative_pause_ms=500, silence_duration_ms=500)
    with pytest.raises(ValueError, match="barge_in_max_pause_ms"):
        TurnDetectorConfig(barge_in_max_pause_ms=-1)


# --- real detectors on noise and speech -----------------------------------------------------


@pytest.fixture(scope="module")
def silero_session():
    return create_silero_session()


@pytest.fixture(scope="module")
def speech_16k(tmp_path_factory) -> np.ndarray:
    """One espeak-ng sentence, resampled 22.05 → 16 kHz, silence trimmed to |x| > 1e-3."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (apt-get install -y espeak-ng)")
    path = tmp_path_factory.mktemp("speech") / "speech.wav"
    text = "Hello there, I would like to book a table for two people tonight."
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    wav, sr = sf.read(path, dtype="float32")
    x = resample(wav, sr, SR)
    loud = np.flatnonzero(np.abs(x) > 1e-3)
    return x[loud[0] : loud[-1] + 1]


def _white_noise(dbfs: float, seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * SR)) * 10 ** (dbfs / 20)).astype(np.float32)


def _music_like_noise(dbfs: float, seconds: float) -> np.ndarray:
    """A chord of four partials, each slowly amplitude-modulated, scaled to the given RMS."""
    t = np.arange(int(seconds * SR)) / SR
    partials = [(220.0, 0.0, 0.5), (330.0, 1.0, 0.7), (440.0, 2.0, 0.3), (660.0, 0.5, 1.1)]
    x = sum(np.sin(2 * np.pi * f * t + ph) * (0.5 + 0.5 * np.sin(2 * np.pi * am * t)) for f, ph, am in partials)
    return (x / np.sqrt(np.mean(x**2)) * 10 ** (dbfs / 20)).astype(np.float32)


@pytest.mark.parametrize(
    "noise",
    [_white_noise(-40, 3.0, seed=0), _music_like_noise(-30, 3.0), _music_like_noise(-40, 3.0)],
    ids=["white-40dBFS", "music-30dBFS", "music-40dBFS"],
)
def test_silero_turns_ignore_noise(silero_session, noise):
    """Default server_vad (Silero, threshold 0.5) emits no event on 3 s of noise."""
    detector = TurnDetector(TurnDetectorConfig(), SileroVad(silero_session))
    assert detector.feed(noise) == []


def test_silero_turns_on_speech(silero_session, speech_16k):
    """espeak-ng speech after 1 s of silence → one Started near onset − padding, one Stopped after the end."""
    lead_ms, tail_ms = 1000, 1500
    x = np.concatenate([_silence(lead_ms), speech_16k, _silence(tail_ms)])
    config = TurnDetectorConfig()
    events = TurnDetector(config, SileroVad(silero_session)).feed(x)
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    assert len(starts) == 1 and len(stops) == 1
    assert events[0] is starts[0] and events[-1] is stops[0]
    assert abs(starts[0].audio_start_ms - (lead_ms - config.prefix_padding_ms)) <= 150
    speech_end_ms = lead_ms + speech_16k.size // MS
    assert -150 <= stops[0].speech_end_ms - speech_end_ms <= 250
    assert stops[0].audio_end_ms == stops[0].speech_end_ms + config.silence_duration_ms


def test_silero_turns_pause_resume_on_speech(silero_session, speech_16k):
    """Speech, 150 ms pause, speech → a Paused/Resumed pair inside the gap and exactly one Stopped at the end."""
    first = speech_16k[: speech_16k.size // 4]
    x = np.concatenate([_silence(500), first, _silence(150), speech_16k, _silence(1000)])
    events = TurnDetector(TurnDetectorConfig(), SileroVad(silero_session)).feed(x)
    gap_ms = 500 + first.size // MS
    assert isinstance(events[0], SpeechStarted) and isinstance(events[-1], SpeechStopped)
    assert sum(isinstance(e, SpeechStopped) for e in events) == 1
    pairs = [
        (a, b)
        for a, b in zip(events, events[1:])
        if isinstance(a, SpeechPaused) and isinstance(b, SpeechResumed)
    ]
    assert any(gap_ms - 100 <= a.at_ms <= gap_ms + 100 and b.at_ms <= gap_ms + 250 for a, b in pairs)


def test_silero_turns_chunk_size_independent(silero_session, speech_16k):
    """10 ms and 40 ms chunks of real speech give identical Silero turn events."""
    x = np.concatenate([_silence(400), speech_16k, _silence(800)])
    ten = _feed_in_chunks(TurnDetector(TurnDetectorConfig(), SileroVad(silero_session)), x, 10 * MS)
    forty = _feed_in_chunks(TurnDetector(TurnDetectorConfig(), SileroVad(silero_session)), x, 40 * MS)
    assert ten and ten == forty


def test_silero_state_is_per_detector(silero_session, speech_16k):
    """Two detectors sharing one session do not disturb each other's recurrent state."""
    noise = _white_noise(-40, 1.0, seed=1)
    alone, interleaved, other = SileroVad(silero_session), SileroVad(silero_session), SileroVad(silero_session)
    expected, got = [], []
    for i in range(noise.size // 512):
        window = noise[i * 512 : (i + 1) * 512]
        expected.append(alone.speech_prob(window))
        other.speech_prob(speech_16k[i * 512 : (i + 1) * 512])
        got.append(interleaved.speech_prob(window))
    assert expected == got


@pytest.mark.parametrize(("aggressiveness", "dbfs"), [(0, -40), (1, -40), (2, -40), (3, -30)])
def test_webrtc_flags_white_noise_as_speech(aggressiveness, dbfs):
    """Documented weakness: WebRTC VAD starts a turn on plain white noise (−40 dBFS; −30 at mode 3)."""
    detector = TurnDetector(TurnDetectorConfig(), WebRtcVad(aggressiveness))
    events = detector.feed(_white_noise(dbfs, 3.0, seed=0))
    assert any(isinstance(e, SpeechStarted) for e in events)


class LaggingVad:
    """Energy VAD whose probability stays at 0.9 for `lag` windows after the sound stops (Silero's decay)."""

    window_num_samples = 160

    def __init__(self, lag: int) -> None:
        self.lag, self._since_loud = lag, 10**9

    def speech_prob(self, window: np.ndarray) -> float:
        self._since_loud = 0 if np.sqrt(np.mean(window**2)) > 0.01 else self._since_loud + 1
        return 1.0 if self._since_loud == 0 else 0.9 if self._since_loud <= self.lag else 0.0

    def reset(self) -> None:
        self._since_loud = 10**9


@pytest.mark.parametrize(("lag", "quiet_db", "max_backdate_ms", "end_ms"),
                         [(6, 40.0, 150, 1800), (6, 0.0, 150, 1860), (6, 40.0, 30, 1830), (0, 40.0, 150, 1800)])
def test_turn_detector_dates_silence_back_over_quiet_windows(lag, quiet_db, max_backdate_ms, end_ms):
    """The VAD confirms silence `lag` windows late; the silence is dated back to where the sound stopped (windows
    quiet_db below the turn's loudest), at most max_backdate_ms; quiet_db 0 keeps the VAD's own date."""
    x = np.concatenate([_silence(1000), _tone(800), _silence(1000)])
    config = TurnDetectorConfig(quiet_db=quiet_db, max_backdate_ms=max_backdate_ms)
    events = TurnDetector(config, LaggingVad(lag)).feed(x)
    assert events[0] == SpeechStarted(audio_start_ms=700, speech_start_ms=1000)
    assert events[-1] == SpeechStopped(audio_end_ms=end_ms + config.silence_duration_ms, speech_end_ms=end_ms)
    assert SpeechPaused(at_ms=end_ms) in events


def test_turn_detector_does_not_date_back_over_sound():
    """Low-level sound after speech (within quiet_db of the loudest window) is not silence: no backdating."""
    tail = (0.05 * np.sin(2 * np.pi * 300 * np.arange(60 * MS) / SR)).astype(np.float32)  # -16 dB below the tone
    x = np.concatenate([_silence(1000), _tone(800), tail, _silence(1000)])

    class Stub(LaggingVad):
        def speech_prob(self, window):  # the tail is scored as fading speech
            return 1.0 if np.sqrt(np.mean(window**2)) > 0.1 else 0.9 if np.sqrt(np.mean(window**2)) > 0.01 else 0.0

    events = TurnDetector(TurnDetectorConfig(), Stub(0)).feed(x)
    assert events[-1].speech_end_ms == 1860


def _guarded_scripted(probs: list[float]) -> list:
    """Speech windows at -20 dBFS, the others at -80."""
    detector = TurnDetector(TurnDetectorConfig(), ScriptedVad(probs))
    detector.guard_barge_in(True)
    return detector.feed(np.repeat([0.1 if p >= 0.5 else 1e-4 for p in probs], 160).astype(np.float32))


def test_guarded_a_dip_inside_a_word_is_not_a_second_word():
    """While a reply plays, speech that resumes after a gap is a second word (a real interruption) only when the
    gap lasts `barge_in_word_gap_ms` (96 ms): a dip of two 32 ms Silero windows inside "o-kay" keeps it a
    backchannel, the pause after a comma ("Wait, stop.") is longer."""
    for dip_ms in (30, 70, 90):  # 150 ms, a dip, 150 ms: one word
        dip = [1.0] * 15 + [0.0] * (dip_ms // 10) + [1.0] * 15 + [0.0] * 40
        assert not [e for e in _guarded_scripted(dip) if isinstance(e, SpeechStarted)], dip_ms
    words = [1.0] * 15 + [0.0] * 10 + [1.0] * 15 + [0.0] * 40  # the same with a 100 ms gap: two words
    assert [e for e in _guarded_scripted(words) if isinstance(e, SpeechStarted)]


def test_guarded_a_sound_onset_is_judged_before_the_vad_calls_it_speech():
    """While a reply plays, a window 12 dB above the quiet before it (a fricative, a soft onset) is judged as a
    candidate (the reply is held) for `barge_in_onset_ms` though the VAD says silence; a sustained sound opens one
    such window, not one per window; unguarded, nothing is judged."""
    for guard in (True, False):
        detector = TurnDetector(TurnDetectorConfig(barge_in_onset_ms=50), ScriptedVad([0.0] * 300))
        detector.guard_barge_in(guard)
        judged = []
        for x in (_silence(500), _tone(800), _silence(500)):
            for i in range(0, x.size, 160):
                detector.feed(x[i: i + 160])
                judged.append(detector.judging_barge_in)
        expected = [False] * 50 + [True] * 5 + [False] * 125 if guard else [False] * 180
        assert judged == expected
