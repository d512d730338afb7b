"""Turn-detection modes on espeak-ng speech, offline through the session's own `InputTurns`.

For each mode: split-turn rate on utterances with a mid-sentence pause (more than one SpeechEnded),
end-of-speech → turn-end delay on complete sentences, and Smart Turn CPU ms per decision.
Run: `python3 -m bench.end_of_turn [--pause-ms 700]` (synthesises with espeak-ng; ~1 min on one core);
`--cost`: Smart Turn CPU ms per decision by batch size; `--load 64`: 64 sessions' decisions on 2 threads;
`--words`: each semantic_vad mode twice, prosody alone and prosody + an ORACLE words judgement (fed to
`InputTurns` at each pause, as the session feeds the thinker's `TurnJudgement`: P(complete) 0 while the audio so
far ends mid-sentence, 1 at the real end). The oracle is an upper bound of the combined policy, not Ming: a real
checkpoint's judgement accuracy is not measured here. `--words-accuracy 1,0.9,0.8`: also an IMPERFECT judge, the
oracle's answer flipped (0 <-> 1) with probability 1 - accuracy (seeded per utterance and pause, `--seed`, averaged
over `--seeds` seeds); `--words-latency-ms`: the answer arrives this much audio time after the pause's
SpeechPaused (dropped if the pause is over by then; the answer is then always waited for, as a real-time
stream's answer within `words_wait_ms` of the decision point is); `--decide-after-ms` / `--early-ms`: override the policy of
high / auto / medium (both its decision points, with and without words) (Smart Turn calls are memoised per audio, so the variants cost one set of calls). `--judge-cost`: ms from submit to `TurnJudgement` of one
JUDGE_TURN on the tiny CPU engine (forked from a spoken reply's prefill).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import soxr

from realtime_ming.audio import end_of_turn
from realtime_ming.audio.end_of_turn import SmartTurn, smart_turn_features
from realtime_ming.audio.turns import SpeechPaused
from realtime_ming.audio.vad import VadKind, create_silero_session, create_vad
from realtime_ming.protocol.audio_input import Eagerness, SemanticVad, ServerVad
from realtime_ming.protocol.values import AudioFormat
from realtime_ming.session.config import VadSettings
from realtime_ming.session.input import InputTurns, SpeechEnded

__all__ = ["COMPLETE", "PAUSED", "VOICES", "espeak", "main", "run_turn"]

# "<p>" marks the mid-sentence pause.
PAUSED = (
    "I'd like to book a table for <p> four people at eight.",
    "Can you tell me <p> what the weather will be tomorrow?",
    "My flight lands late in the evening, so <p> which is faster, the train or a taxi?",
    "I was wondering if <p> you could help me with my homework.",
    "Please remind me to call <p> my sister on Sunday.",
)
COMPLETE = (
    "What time is it?",
    "Can you tell me a quick fact about the moon?",
    "Please remind me what the weather will be like tomorrow morning.",
    "I need a taxi to the airport.",
    "Thank you, that is all.",
)
VOICES = ("en-us", "en-gb+f3", "en-us+m3")
_WIRE_HZ = 24000
_CHUNK_MS = 20


ESPEAK_CACHE_ENV = "REALTIME_MING_ESPEAK_CACHE"  # a folder of rendered clips: machines without espeak-ng (the GPU image)


def espeak(text: str, voice: str, pause_ms: int = 0, wpm: int = 170) -> np.ndarray:
    """float32 24 kHz speech; `<p>` becomes an SSML break of `pause_ms`. With $REALTIME_MING_ESPEAK_CACHE set, a
    clip rendered before (on a machine with espeak-ng, same arguments) is read from there, a new one written."""
    ssml = "<speak>" + text.replace("<p>", f'<break time="{pause_ms}ms"/>') + "</speak>"
    cache = os.environ.get(ESPEAK_CACHE_ENV)
    path = None
    if cache:
        key = hashlib.sha256(json.dumps([ssml, voice, wpm]).encode()).hexdigest()[:20]
        path = os.path.join(cache, f"{key}.wav")
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = f.read()
            return _espeak_pcm(raw)
    raw = subprocess.run(["espeak-ng", "-m", "-v", voice, "-s", str(wpm), "--stdout", ssml],
                         check=True, capture_output=True).stdout
    if path is not None:
        os.makedirs(cache, exist_ok=True)
        with open(path, "wb") as f:
            f.write(raw)
    return _espeak_pcm(raw)


def _espeak_pcm(raw: bytes) -> np.ndarray:
    pcm = np.frombuffer(raw[44:], dtype=np.int16).astype(np.float32) / 32768.0  # espeak: 22.05 kHz wav
    loud = np.flatnonzero(np.abs(pcm) > 0.003)
    return soxr.resample(pcm[loud[0]: loud[-1] + 1], 22050, _WIRE_HZ).astype(np.float32)


def oracle_judge(accuracy: float = 1.0, rng: np.random.Generator | None = None) -> Callable[[bool], float]:
    """The words judgement of the bench: P(complete) 1 at the real end of the utterance, 0 mid-sentence (the
    ORACLE), flipped with probability 1 - `accuracy` (an imperfect judge; `rng` draws one number a judgement)."""
    if accuracy < 1.0 and rng is None:
        raise ValueError("an imperfect judge needs an rng")

    def judge(at_end: bool) -> float:
        right = accuracy >= 1.0 or rng.random() < accuracy  # type: ignore[union-attr]
        return 1.0 if at_end == right else 0.0

    return judge


def run_turn(turns: InputTurns, speech: np.ndarray, tail_ms: int = 9000,
             words: Callable[[bool], float] | None = None, words_latency_ms: int = 0) -> tuple[list[int], list[float]]:
    """Stream speech + silence in 20 ms appends; (turn-end delays after the speech end in ms, CPU ms). `words`: at
    each pause a words judgement told whether the audio so far is the whole utterance (`oracle_judge`), its answer
    handed over `words_latency_ms` of audio after the pause's SpeechPaused (as the session feeds `TurnJudgement`)."""
    audio = np.concatenate([speech, np.zeros(_WIRE_HZ * tail_ms // 1000, np.float32)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    step = _WIRE_HZ * _CHUNK_MS // 1000
    ends, cpu = [], []
    pending: list[tuple[int, str, float]] = []  # (sample index due, judgement id, answer)
    for i in range(0, pcm.size, step):
        turns.last_decision = None
        signals = turns.append(base64.b64encode(pcm[i: i + step].tobytes()).decode())
        if words is not None and any(isinstance(s, SpeechPaused) for s in signals) and turns.expect_judgement(f"j-{i}"):
            pending.append((i + _WIRE_HZ * words_latency_ms // 1000, f"j-{i}", words(i + step >= speech.size)))
        while pending and pending[0][0] <= i:
            _due, judge_id, answer = pending.pop(0)
            signals += turns.on_judgement(judge_id, answer)  # a pause that is over drops it
        for signal in signals:
            if isinstance(signal, SpeechEnded):
                ends.append((i + step) * 1000 // _WIRE_HZ - speech.size * 1000 // _WIRE_HZ)
        if turns.last_decision is not None:
            cpu.append(turns.last_decision[1])
    return ends, cpu


def _memoised(model: Callable[[np.ndarray], float]) -> Callable[[np.ndarray], float]:
    """Smart Turn is deterministic: the same audio gets the same answer, computed once."""
    cache: dict[bytes, float] = {}

    def predict(audio: np.ndarray) -> float:
        key = hashlib.blake2b(np.ascontiguousarray(audio).tobytes(), digest_size=16).digest()
        if key not in cache:
            cache[key] = model(audio)
        return cache[key]

    return predict


def _override_policy(decide_after_ms: int | None, early_ms: int | None, no_override: bool = False,
                     patient: bool = False) -> None:
    """Set the decision point of high / auto / medium for this process (the bench's variants); `no_override`: the
    words never overrule prosody's "incomplete" (the policy before `words_override`); `patient`: wait for the words
    without the wall-clock `words_wait_ms` (the bench's audio runs faster than real time, so a wall-clock wait that
    began before a slow Smart Turn call would run out at random)."""
    for name, policy in end_of_turn.EAGERNESS_POLICY.items():
        if patient:
            policy = dataclasses.replace(policy, words_wait_ms=3_600_000)
        if name != "low" and decide_after_ms is not None:
            policy = dataclasses.replace(policy, decide_after_ms=decide_after_ms, words_decide_after_ms=decide_after_ms)
        if name != "low" and early_ms is not None:
            policy = dataclasses.replace(policy, early_ms=early_ms)
        end_of_turn.EAGERNESS_POLICY[name] = dataclasses.replace(
            policy, words_override=None if no_override else policy.words_override)


def _modes() -> dict[str, object]:
    return {
        "server_vad 500 ms": ServerVad(),
        "server_vad 200 ms": ServerVad(silence_duration_ms=200),
        **{f"semantic_vad {e.value}": SemanticVad(eagerness=e) for e in (Eagerness.HIGH, Eagerness.AUTO, Eagerness.LOW)},
    }


def cost(clips: list[np.ndarray], batches: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 3) -> dict:
    """CPU ms of one decision (process CPU time, every thread counted): features alone, and features + ONNX
    per clip at each batch size (medians), one caller at a time."""
    model = SmartTurn()
    out: dict[str, float] = {"load_avg_1m_before": round(os.getloadavg()[0], 2)}
    started = time.process_time()
    for _ in range(repeats):
        for c in clips:
            smart_turn_features(c)
    out["features_cpu_ms"] = round((time.process_time() - started) * 1000.0 / (repeats * len(clips)), 1)
    for b in batches:
        per_clip = []
        for _ in range(repeats):
            for i in range(0, len(clips) - b + 1, b):
                started = time.process_time()
                model.predict_batch(clips[i: i + b])
                per_clip.append((time.process_time() - started) * 1000.0 / b)
        out[f"batch{b}_cpu_ms_per_decision"] = round(statistics.median(per_clip), 1)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out


def load(clips: list[np.ndarray], sessions: int, turn_s: float, workers: int, duration_s: float,
         fallback_s: float | None = 4.0) -> dict:
    """`sessions` sessions each asking one decision every `turn_s` (staggered), served as the server serves
    them: `workers` decision threads, the shared `SmartTurn` with `workers` concurrent runs. A decision not
    started `fallback_s` after it was asked is shed (its pause already ended at the silence fallback and
    `InputTurns` cancelled it); `fallback_s` None: a plain FIFO that runs everything.
    Latency: ask → answer of the decisions served; it keeps up when served ≈ offered and p90 stays bounded."""
    model = SmartTurn(max_concurrent=workers)
    model.predict(clips[0])  # warm
    done: list[tuple[float, float]] = []  # (ask → answer s, answered at)
    lock = threading.Lock()

    def decide(due: float, clip: np.ndarray) -> None:
        model.predict(clip)
        now = time.monotonic()
        with lock:
            done.append((now - due, now))

    t0 = time.monotonic()
    schedule = sorted((t0 + (k + s / sessions) * turn_s, s) for s in range(sessions)
                      for k in range(int(duration_s / turn_s)))
    waiting: list[tuple[float, Future]] = []  # (shed at, call) oldest first
    shed = 0

    def shed_due(now: float) -> int:
        n = 0
        while waiting and (waiting[0][1].done() or waiting[0][0] <= now):
            n += waiting.pop(0)[1].cancel()
        return n

    cpu0, load0 = time.process_time(), os.getloadavg()[0]
    with ThreadPoolExecutor(workers, thread_name_prefix="end-of-turn") as pool:
        for due, s in schedule:
            time.sleep(max(0.0, due - time.monotonic()))
            if fallback_s is not None:
                shed += shed_due(time.monotonic())
            waiting.append((due + (fallback_s or 0.0), pool.submit(decide, due, clips[s % len(clips)])))
        while fallback_s is not None and waiting:
            shed += shed_due(time.monotonic())
            time.sleep(0.01)
    cpu_ms = 1000 * (time.process_time() - cpu0)
    lat = sorted(d for d, _ in done)
    wall = max(a for _, a in done) - t0
    return {
        "sessions": sessions, "turn_every_s": turn_s, "workers": workers, "shed_after_s": fallback_s,
        "asked": len(schedule), "served": len(lat), "shed": shed,
        "offered_per_s": round(sessions / turn_s, 1), "served_per_s": round(len(lat) / wall, 1),
        "latency_ms_p50": round(1000 * lat[len(lat) // 2], 1), "latency_ms_p90": round(1000 * lat[int(0.9 * (len(lat) - 1))], 1),
        "latency_ms_max": round(1000 * lat[-1], 1), "cpu_ms_per_decision": round(cpu_ms / len(lat), 1),
        "cpu_cores_busy": round(cpu_ms / 1000 / wall, 2),
        "load_avg_1m_before": round(load0, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def judge_cost(repeats: int = 10) -> dict:
    """ms from submit to `TurnJudgement` of a JUDGE_TURN forked from a spoken reply (1.5 s of espeak-ng speech) on
    the tiny CPU engine, and of the reply's own prefill (submit → PREFILL_DONE) it waits for; medians."""
    from realtime_ming.engine import Engine
    from realtime_ming.engine.api import (
        Content,
        Message,
        SamplingParams,
        Stage,
        StageMark,
        TurnDone,
        TurnJudgement,
        TurnRequest,
        TurnTask,
    )
    from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
    from realtime_ming.engine.turn_judgement import judgement_history

    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(turn_judgement="on")))
    audio = soxr.resample(espeak("I'd like to book a table for", "en-us"), _WIRE_HZ, 16000).astype(np.float32)
    history = (Message("user", (Content.of_audio(audio, 16000),)),)
    judged, prefilled, alone = [], [], []
    try:
        for k in range(repeats + 1):
            marks: dict[str, float] = {}
            done = threading.Event()

            def sink(event, marks=marks, done=done) -> None:
                now = time.monotonic()
                if isinstance(event, TurnJudgement):
                    marks["judged"] = now
                elif isinstance(event, StageMark) and event.stage is Stage.PREFILL_DONE:
                    marks.setdefault(f"prefill-{event.turn_id}", now)
                elif isinstance(event, TurnDone) and event.turn_id.startswith("judge"):
                    done.set()

            reply = TurnRequest(f"reply{k}", f"conv{k}", history, sampling=SamplingParams(max_tokens=4),
                                with_audio=False)  # not speculative: its PREFILL_DONE mark is delivered
            judge = TurnRequest(f"judge{k}", f"conv{k}_eot", judgement_history(history), with_audio=False,
                                task=TurnTask.JUDGE_TURN, prefix_from=reply.conversation_id)
            t0 = time.monotonic()
            engine.submit(reply, sink)
            engine.submit(judge, sink)
            done.wait(60)
            engine.cancel(reply.turn_id)
            if k:  # the first is a warmup
                judged.append((marks["judged"] - t0) * 1e3)
                prefilled.append((marks[f"prefill-reply{k}"] - t0) * 1e3)
                alone.append((marks["judged"] - marks[f"prefill-reply{k}"]) * 1e3)
            for conversation in (reply.conversation_id, judge.conversation_id):
                engine.close_conversation(conversation)
    finally:
        engine.close()
    return {"repeats": repeats, "speech_s": round(audio.size / 16000, 2),
            "submit_to_judgement_ms_p50": round(statistics.median(judged), 1),
            "submit_to_reply_prefill_done_ms_p50": round(statistics.median(prefilled), 1),
            "reply_prefill_done_to_judgement_ms_p50": round(statistics.median(alone), 1),
            "submit_to_judgement_ms_max": round(max(judged), 1),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pause-ms", type=int, default=700)
    parser.add_argument("--modes", default="", help="comma-separated substrings of mode names (default: all)")
    parser.add_argument("--cost", action="store_true", help="only the Smart Turn cost per decision and batch size")
    parser.add_argument("--load", type=int, default=0, metavar="SESSIONS",
                        help="only the concurrent-session load test with this many sessions")
    parser.add_argument("--turn-s", type=float, default=4.0, help="load: seconds between one session's decisions")
    parser.add_argument("--workers", type=int, default=2, help="load: threads serving decisions (cores)")
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--words", action="store_true",
                        help="semantic_vad modes with prosody alone and with prosody + the ORACLE words judgement")
    parser.add_argument("--words-accuracy", default="1",
                        help="--words: comma-separated accuracies of the judge (1 = the oracle; <1 flips answers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tail-ms", type=int, default=9000, help="silence streamed after each utterance")
    parser.add_argument("--seeds", type=int, default=5, help="seeds averaged for an imperfect judge")
    parser.add_argument("--words-latency-ms", type=int, default=0,
                        help="--words: audio ms from the pause's SpeechPaused to the judgement's answer")
    parser.add_argument("--decide-after-ms", type=int, default=None, help="high/auto/medium decision point")
    parser.add_argument("--early-ms", type=int, default=None, help="high/auto/medium: Smart Turn call this early")
    parser.add_argument("--no-override", action="store_true",
                        help="words never overrule prosody's \"incomplete\" (the policy without words_override)")
    parser.add_argument("--judge-cost", action="store_true", help="only the JUDGE_TURN cost on the tiny CPU engine")
    parser.add_argument("--shed-after-s", type=float, default=4.0,
                        help="load: shed a decision not started this long after it was asked (semantic_vad auto's "
                             "silence fallback); 0: a FIFO that runs every decision")
    args = parser.parse_args(argv)
    if args.judge_cost:
        print(json.dumps(judge_cost()))
        return
    if args.cost or args.load:
        clips = [soxr.resample(espeak(t, v), _WIRE_HZ, 16000).astype(np.float32) for t in COMPLETE for v in VOICES[:2]]
        print(json.dumps(cost(clips) if args.cost else load(clips, args.load, args.turn_s, args.workers, args.duration_s, args.shed_after_s or None)))
        return
    _override_policy(args.decide_after_ms, args.early_ms, args.no_override, patient=args.words_latency_ms > 0)
    wanted = [m for m in args.modes.split(",") if m]
    session = create_silero_session()
    smart_turn = _memoised(SmartTurn().predict) if args.words else SmartTurn().predict  # --words: CPU ms moot
    paused = [espeak(t, v, args.pause_ms) for t in PAUSED for v in VOICES]
    complete = [espeak(t, v) for t in COMPLETE for v in VOICES]
    results = {}
    modes: list[tuple[str, object, float | None]] = [(name, td, None) for name, td in _modes().items()]
    if args.words:
        accuracies = [float(a) for a in args.words_accuracy.split(",")]
        modes = [(f"{name}{'' if acc is None else ' + words (oracle)' if acc >= 1 else f' + words (accuracy {acc})'}",
                  td, acc)
                 for name, td, _ in modes if isinstance(td, SemanticVad) for acc in (None, *accuracies)]
    for name, td, accuracy in modes:
        if wanted and not any(w in name for w in wanted):
            continue
        seeds = range(args.seed, args.seed + (args.seeds if accuracy is not None and accuracy < 1 else 1))
        splits, delays, cpu = 0, [], []
        for seed in seeds:
            turns = InputTurns(VadSettings(), lambda _kind: create_vad(VadKind.SILERO, silero_session=session), 60.0,
                               end_of_turn=smart_turn, decision_wait_s=None)  # faster than real time: wait for answers
            turns.configure(AudioFormat(), td)
            turns.words_judged = accuracy is not None  # as the session sets it where the engine judges words
            for k, speech in enumerate(paused + complete):
                judge = None if accuracy is None else oracle_judge(accuracy, np.random.default_rng([seed, k]))
                ends, c = run_turn(turns, speech, args.tail_ms, words=judge, words_latency_ms=args.words_latency_ms)
                if k < len(paused):
                    splits += len(ends) != 1
                else:
                    delays += ends[-1:]
                cpu += c
        policy = end_of_turn.EAGERNESS_POLICY[td.eagerness.value] if isinstance(td, SemanticVad) else None
        policy = policy.with_words() if policy is not None and accuracy is not None else policy
        results[name] = {
            "split_rate": round(splits / (len(paused) * len(seeds)), 3),
            "turn_end_after_speech_ms_p50": statistics.median(delays),
            "turn_end_after_speech_ms_p90": sorted(delays)[int(0.9 * (len(delays) - 1))],
            "turn_end_after_speech_ms_max": max(delays),
            "smart_turn_cpu_ms_p50": round(statistics.median(cpu), 1) if cpu and not args.words else None,
            "n_paused": len(paused), "n_complete": len(complete), "seeds": len(seeds), "pause_ms": args.pause_ms,
            **({"decide_after_ms": policy.decide_after_ms, "early_ms": policy.early_ms,
                "words_override": policy.words_override, "words_latency_ms": args.words_latency_ms} if policy else {}),
        }
        print(name, json.dumps(results[name]), flush=True)

if __name__ == "__main__":
    main()
