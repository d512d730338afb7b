"""bench/ without a server: the simulated player, per-turn samples and failure reasons from hand-built
timelines, summaries, speech-end detection on known audio, microphone pacing, config and CLI parsing.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soundfile as sf

from realtime_ming.bench.cli import add_arguments, config_from_args
from realtime_ming.bench.client import Microphone, session_update
from realtime_ming.bench.config import BenchConfig, Target, TurnMode, http_base
from realtime_ming.bench.metrics import play, summarise, turn_sample
from realtime_ming.bench.trace import ResponseTrace, TurnTrace, b64_num_bytes, clock
from realtime_ming.bench.turns import wav_dir_turns

RATE = 24000


def _response(audio: list[tuple[float, int]], *, status="completed", reason=None, done=None, rid="r1"):
    r = ResponseTrace(rid, created_at=audio[0][0] - 0.1 if audio else 0.0)
    for t, n in audio:
        r.add_audio(t, n)
    r.status, r.reason = status, reason
    r.done_at = done if done is not None else (audio[-1][0] + 0.01 if audio else 1.0)
    return r


def _trace(responses, **kw) -> TurnTrace:
    trace = TurnTrace(0, 0, "t", False, speech_end_offset_s=1.0, speech_start_at=10.0, speech_sent_at=11.5,
                      speech_stopped_at=[11.5], committed_at=[11.5], **kw)
    trace.responses = responses
    return trace


def test_play_counts_only_stalls_of_an_empty_buffer():
    """Player: 0.1 s chunks at 0, 0.01, 0.5 s → the buffer runs dry at 0.2 s: one 0.3 s underrun."""
    assert play([0.0, 0.01, 0.5], [2400, 2400, 2400], RATE) == pytest.approx([0.3])
    assert play([0.0, 0.1, 0.2], [2400, 2400, 2400], RATE) == []


def test_b64_num_bytes_matches_decoding():
    """b64_num_bytes equals len(b64decode(x)) for every padding case."""
    for n in (0, 1, 2, 3, 958, 959, 960):
        text = base64.b64encode(bytes(n)).decode()
        assert b64_num_bytes(text) == n


def test_turn_sample_timeline_numbers():
    """A hand-built VAD turn: TTFA_user 0.7 s, TTFA_server 0.2 s, one 0.4 s underrun, RTF 3."""
    r = _response([(11.7, 4800), (11.75, 4800), (12.5, 2400)], done=12.6)
    r.first_text_at = 11.6
    r.timings = {"first_audio_delta": 201.0}
    s = turn_sample(_trace([r]), RATE)
    assert s["ok"] and s["failure"] is None
    assert s["ttfa_user_s"] == pytest.approx(0.7)
    assert s["ttfa_server_s"] == pytest.approx(0.2)
    assert s["ttfa_server_from"] == "speech_stopped"
    assert s["ttfa_server_reported_s"] == pytest.approx(0.201)
    assert s["ttft_user_s"] == pytest.approx(0.6)
    assert s["vad_delay_s"] == pytest.approx(0.5)
    assert s["audio_s"] == pytest.approx(0.5)
    assert s["underrun_max_s"] == pytest.approx(0.4)
    assert (s["num_underruns_over_50ms"], s["num_underruns_over_200ms"]) == (1, 1)
    assert s["max_gap_s"] == pytest.approx(0.75)
    assert s["rtf"] == pytest.approx(3.0)
    assert s["chunks"]["at_ms"] == pytest.approx([700.0, 750.0, 1500.0])


@pytest.mark.parametrize(
    ("responses", "errors", "failure"),
    [
        ([_response([(11.7, 480)], status="incomplete", reason="max_output_tokens")], [], None),
        ([_response([(11.7, 480)], status="cancelled", reason="turn_detected")], [], "status=cancelled"),
        ([_response([(11.7, 480)]), _response([(12.7, 480)], rid="r2")], [], "num_responses=2"),
        ([_response([])], [], "no_audio"),
        ([_response([(11.7, 480)])], [{"code": "server_error", "message": "x", "at": 11.6}], "error:server_error"),
    ],
)
def test_turn_sample_failure_reasons(responses, errors, failure):
    """A turn fails on a cut, split, silent or erroring response; a max_output_tokens cut is a success."""
    s = turn_sample(_trace(responses, errors=errors), RATE)
    assert (s["failure"], s["ok"]) == (failure, failure is None)


def test_turn_sample_audio_after_done_fails():
    """An audio delta after response.done is counted and fails the turn."""
    r = _response([(11.7, 480)], done=11.8)
    r.add_audio(11.9, 480)
    s = turn_sample(_trace([r]), RATE)
    assert (s["num_deltas_after_done"], s["failure"]) == (1, "audio_after_done")


def test_turn_sample_barge_in_stop_latency():
    """Barge-in: speech_started 13.0, last delta 13.05, cancelled done 13.08 → stop 50 / 80 ms, detect 0.2 s."""
    first = _response([(11.7, 4800), (13.05, 4800)], status="cancelled", reason="turn_detected", done=13.08)
    followup = _response([(15.0, 4800)], status="completed", done=15.5, rid="r2")
    trace = _trace([first, followup], barge_turn_name="b", barge_start_at=12.8, barge_end_offset_s=1.0)
    trace.speech_started_at = [10.2, 13.0]
    trace.committed_at.append(14.5)
    s = turn_sample(trace, RATE)
    assert s["ok"], s["failure"]
    barge = s["barge"]
    assert barge["stop_last_delta_s"] == pytest.approx(0.05)
    assert barge["stop_done_s"] == pytest.approx(0.08)
    assert barge["detect_s"] == pytest.approx(0.2)
    assert (barge["cancelled"], barge["missed"], barge["followup_status"]) == (True, False, "completed")


def test_summarise_percentiles_and_continuity_shares():
    """Four turns with TTFA 0.1..0.4 s: p50 0.25 s; C50 counts the share with worst stall <= 50 ms."""
    samples = []
    for k, ttfa in enumerate((0.1, 0.2, 0.3, 0.4)):
        gap = 0.5 if k == 3 else 0.0  # one response stalls 0.5 - 0.1 = 0.4 s
        r = _response([(11.0 + ttfa, 2400), (11.0 + ttfa + gap, 2400)])
        samples.append(turn_sample(_trace([r]), RATE))
    warm = dict(samples[0], is_warmup=True, ttfa_user_s=9.0)
    summary = summarise([warm, *samples], wall_s=2.0)
    assert summary["num_turns"] == 4 and summary["num_ok"] == 4
    assert summary["ttfa_user_s"]["p50"] == pytest.approx(0.25)
    assert summary["ttfa_user_s"]["p99"] == pytest.approx(0.397)
    assert (summary["c50"], summary["c200"]) == (0.75, 0.75)
    assert summary["num_underruns_over_200ms"] == 1
    assert summary["audio_s_per_wall_s"] == pytest.approx(4 * 0.2 / 2.0)


def test_wav_dir_turn_speech_end_is_the_last_loud_sample(tmp_path):
    """A 16 kHz wav (0.2 s silence, 0.5 s tone, 0.3 s silence) → 24 kHz, speech ends at 0.7 s (±1 ms)."""
    t = np.arange(8000) / 16000
    wav = np.concatenate([np.zeros(3200), 0.3 * np.sin(2 * np.pi * 220 * t), np.zeros(4800)]).astype(np.float32)
    sf.write(tmp_path / "a.wav", wav, 16000)
    (tmp_path / "a.txt").write_text("hello\n")
    (turn,) = wav_dir_turns(tmp_path)
    assert turn.pcm16.size == 24000 and turn.text == "hello"
    assert abs(turn.speech_end_sample - int(0.7 * RATE)) <= RATE // 1000


async def test_microphone_paces_frames_against_absolute_deadlines():
    """Manual-mode microphone: 5 frames of 20 ms; frame i leaves no earlier than start + (i+1)·20 ms."""
    sent: list[tuple[float, int]] = []

    async def send(message: str) -> None:
        sent.append((clock(), len(base64.b64decode(json.loads(message)["audio"]))))

    mic = Microphone(send, rate_hz=RATE, frame_ms=20, stream_silence=False)
    task = asyncio.create_task(mic.run())
    try:
        speech = mic.speak(np.ones(4 * 480 + 100, np.int16))
        start = await speech.started
        await speech.sent
    finally:
        task.cancel()
    assert [n for _, n in sent] == [960, 960, 960, 960, 200]
    for i, (t, _) in enumerate(sent):
        assert t >= start + (i + 1) * 0.02 - 0.002


def test_config_urls_and_session_update():
    """?model= is added once; the HTTP base keeps host:port; manual mode sends turn_detection null."""
    target = Target("A", "wss://h:9/v1/realtime", model="m", session={"audio": {"output": {"voice": "v"}}})
    assert target.ws_url == "wss://h:9/v1/realtime?model=m"
    assert Target("A", "ws://h/v1/realtime?model=x", model="m").ws_url == "ws://h/v1/realtime?model=x"
    assert http_base("wss://h:9/v1/realtime?model=m") == "https://h:9"
    cfg = BenchConfig(targets=(target,), mode=TurnMode.MANUAL, max_output_tokens=8)
    session = session_update(cfg, target)
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "v"}
    assert session["max_output_tokens"] == 8
    with pytest.raises(ValueError, match="barge_in needs mode vad"):
        BenchConfig(targets=(target,), mode=TurnMode.MANUAL, barge_in=True)


def test_cli_compare_flags_make_a_second_target():
    """--compare-session alone adds target B on the same URL; unset options keep dataclass defaults."""
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--url", "ws://h:1/v1/realtime", "-c", "1,4", "--compare-session",
                              '{"max_output_tokens": 4}', "--out", "/tmp/x"])
    cfg = config_from_args(args)
    assert [t.name for t in cfg.targets] == ["A", "B"]
    assert cfg.targets[1].url == "ws://h:1/v1/realtime" and cfg.targets[1].session == {"max_output_tokens": 4}
    assert cfg.concurrency == (1, 4) and cfg.num_turns == BenchConfig.__dataclass_fields__["num_turns"].default


def test_realtime_ming_cli_dispatches_bench(monkeypatch):
    """`realtime-ming bench` parses the benchmark's own options and hands them to realtime_ming.bench.run."""
    import realtime_ming.bench as bench
    from realtime_ming.cli import build_parser

    seen = []
    monkeypatch.setattr(bench, "run", lambda args: seen.append(args) or 7)
    args = build_parser().parse_args(["bench", "--url", "ws://h:1/v1/realtime", "--mode", "manual"])
    assert args.mode is TurnMode.MANUAL
    assert args.run(args) == 7 and seen == [args]


def test_command_line_redacts_api_keys(monkeypatch):
    """The command recorded in results hides --api-key values in both spellings."""
    from realtime_ming.bench.cli import _command_line

    monkeypatch.setattr("sys.argv", ["/r/bench/__main__.py", "--url", "ws://h", "--api-key", "k1",
                                     "--compare-api-key=k2"])
    assert _command_line() == "realtime-ming bench --url ws://h --api-key '<redacted>' '--compare-api-key=<redacted>'"


def test_listener_drift_splits_the_server_side_from_the_client_side():
    """`bench.barge_in.drift`: four 100 ms deltas the session counted as sent at 0, 0.1, 0.2, 0.3 s (its clock ends
    at 0.4 s). Written 50 ms after the clock said, after the client had played the one before: the client plays
    50 ms behind the clock and the server's send side put it there; written on time, read 50 ms late: the client's."""
    from bench.barge_in import WIRE_HZ
    from bench.listener_drift import drift

    n = WIRE_HZ // 10
    clock = [(0.1 * i, 100.0) for i in range(4)]
    on_time = [0.1 * i for i in range(4)]
    late_third = [0.0, 0.1, 0.25, 0.3]
    assert drift([(t, n) for t in late_third], {"clock": clock, "wrote": late_third}) == {"server": 50.0, "client": 0.0}
    assert drift([(t, n) for t in late_third], {"clock": clock, "wrote": on_time}) == {"server": 0.0, "client": 50.0}
    assert drift([(t, n) for t in on_time], {"clock": clock, "wrote": on_time[:2]}) is None  # a trace cut short
