"""Barge-in while a reply plays: offline through the guarded `TurnDetector`, and as a listener hears it.

Offline (`python3 -m bench.barge_in [--runs 3]`, Silero VAD, espeak-ng, a few seconds a run): per
`barge_in_min_speech_ms`, the false barge-in rate on backchannels and noise bursts (any SpeechStarted); on
real interruptions, onset → output held (the session stops sending at the first window of a guarded speech
candidate) and onset → SpeechStarted (the cancel); on backchannels, how long the output is held. Input is fed
in 20 ms appends; times are at the end of the append that produced the event. These are the server's times,
not the listener's: a client that holds seconds of audio keeps playing it.

Listener (`python3 -m bench.barge_in --listener --url ws://HOST:PORT/v1/realtime`, or `--serve-tiny` to start
the embedded tiny model on CPU in a child process): a standard Realtime client through the real server. Each
trial is one session: a text turn asks for a reply of `--reply-tokens`; a microphone streams 20 ms frames of
silence in real time and, at a set time after the first audio delta, one clip (the 6 x 3 interruptions, the
8 x 3 backchannels and 3 noise bursts of the offline set). The client plays every `response.output_audio.delta`
in order at real time from its arrival (never before the previous one ends) and flushes on
`input_audio_buffer.speech_started`. Each clip is counted in the state the reply was in at its onset:
`generating` (the engine had not finished the turn: the server's `realtime_ming.response.timings` `done`
stage) or `generated` (fully generated, still playing). Reported per state: interruption onset → audible
stop (the last sample the client played) p50 / max; how many non-interruptions stopped the reply
(speech_started, or the response not completed), how many left it incomplete (the audio received differs
from the item's audio, `conversation.item.retrieve`), and the longest pause they caused in playback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from bench.end_of_turn import espeak
from bench.listener_drift import drift, read_sends
from bench.listener_serve import client_priority, serve_story
from realtime_ming.audio.commands import shared_command_spotter
from realtime_ming.audio.config import TurnDetectorConfig
from realtime_ming.audio.turns import SpeechStarted, TurnDetector
from realtime_ming.audio.vad import SileroVad, create_silero_session

__all__ = ["BACKCHANNELS", "INTERRUPTIONS", "Trace", "main", "measure", "noise_bursts", "trace"]

BACKCHANNELS = ("mm-hmm", "uh-huh", "yeah", "okay", "right", "yes", "sure", "I see")
INTERRUPTIONS = ("Wait, stop.", "No, I meant the other one.", "Hold on, that's wrong.",
                 "Actually, can you repeat that?", "Stop.", "Sorry, one more question.")
VOICES = ("en-us", "en-gb+f3", "en-us+m3")


def noise_bursts(rate_hz: int = 16000) -> list[np.ndarray]:
    """A cough-like decaying noise burst, a click, 400 ms of noise (seeded)."""
    rng = np.random.default_rng(0)
    n = rate_hz * 150 // 1000
    cough = rng.normal(0, 0.3, n) * np.exp(-np.linspace(0, 6, n))
    click = np.zeros(rate_hz // 10)
    click[:48] = 0.8
    return [cough.astype(np.float32), click.astype(np.float32), rng.normal(0, 0.05, rate_hz * 2 // 5).astype(np.float32)]


@dataclass(frozen=True, slots=True)
class Trace:
    """One clip over a playing reply (ms after the clip's onset; None: never)."""

    held_ms: int | None  # the output hold began (the reply's audio stops going out)
    started_ms: int | None  # SpeechStarted: the response is cancelled
    released_ms: int | None  # the candidate was dropped: the held output goes out again


def trace(cfg: TurnDetectorConfig, vad: SileroVad, clip16: np.ndarray, command=None) -> Trace:
    """Feed silence, the clip, 1 s of silence in 20 ms appends with the barge-in guard on (`command`: the
    detector's stop-command reader, `audio/commands.py`)."""
    lead = 320
    detector = TurnDetector(cfg, vad, command)
    detector.guard_barge_in(True)
    audio = np.concatenate([np.zeros(16 * lead, np.float32), clip16, np.zeros(16000, np.float32)])
    step = 16 * 20
    held = started = released = None
    for i in range(0, audio.size, step):
        events = detector.feed(audio[i: i + step])
        t = (i + step) // 16 - lead
        if detector.judging_barge_in and held is None:
            held = t
        if any(isinstance(e, SpeechStarted) for e in events):
            started, held = t, t if held is None else held
            break
        if held is not None and released is None and not detector.judging_barge_in:
            released = t
    return Trace(held, started, released)


def _p(values: list[int], q: float) -> float | None:
    values = sorted(values)
    return values[int(q * (len(values) - 1))] if values else None


def measure(cfg: TurnDetectorConfig, vad: SileroVad, command=None) -> dict:
    to16 = lambda x: soxr.resample(x, 24000, 16000).astype(np.float32)
    others = [trace(cfg, vad, to16(espeak(t, v)), command) for t in BACKCHANNELS for v in VOICES]
    others += [trace(cfg, vad, x, command) for x in noise_bursts()]
    real = [trace(cfg, vad, to16(espeak(t, v)), command) for t in INTERRUPTIONS for v in VOICES]
    stops = [r.held_ms for r in real if r.started_ms is not None]
    cancels = [r.started_ms for r in real if r.started_ms is not None]
    pauses = [o.released_ms - o.held_ms for o in others if o.started_ms is None and o.held_ms is not None]
    return {
        "barge_in_min_speech_ms": cfg.barge_in_min_speech_ms,
        "false_barge_in_rate": round(sum(o.started_ms is not None for o in others) / len(others), 3),
        "missed_interruptions": sum(r.started_ms is None for r in real),
        "stop_ms_p50": _p(stops, 0.5), "stop_ms_p90": _p(stops, 0.9), "stop_ms_max": _p(stops, 1.0),
        "cancel_ms_p50": _p(cancels, 0.5), "cancel_ms_p90": _p(cancels, 0.9),
        "backchannel_pause_ms_p50": _p(pauses, 0.5), "backchannel_pause_ms_max": _p(pauses, 1.0),
        "backchannels_held": len(pauses),
        "n_backchannel_or_noise": len(others), "n_interruptions": len(real),
    }


# ---- the listener: a standard client through the real server ---------------------------------------------------
WIRE_HZ = 24000
FRAME_S = 0.02
STATES = ("generating", "generated")
STORY = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told long stories "
         "to every child who would listen, about storms, lighthouses and the whales he had seen. ")


@dataclass(frozen=True, slots=True)
class Clip:
    kind: str  # "interruption" | "other" (backchannel, cough, click, noise)
    name: str
    pcm: np.ndarray  # float32 at WIRE_HZ


def listener_clips() -> tuple[list[Clip], list[Clip]]:
    """(interruptions, others): the offline set's clips at the wire rate."""
    real = [Clip("interruption", f"{t} [{v}]", espeak(t, v)) for t in INTERRUPTIONS for v in VOICES]
    others = [Clip("other", f"{t} [{v}]", espeak(t, v)) for t in BACKCHANNELS for v in VOICES]
    names = ("cough", "click", "noise")
    others += [Clip("other", n, soxr.resample(x, 16000, WIRE_HZ).astype(np.float32))
               for n, x in zip(names, noise_bursts())]
    return real, others


def played(deltas: list[tuple[float, int]], flush_at: float | None) -> list[tuple[float, float]]:
    """The standard client's playback: (start, end) of each delta (arrival, samples) played in order at real time
    from its arrival, cut at `flush_at` (speech_started), later ones dropped."""
    segments, end = [], float("-inf")
    for at, n in deltas:
        if flush_at is not None and at >= flush_at:
            break
        start = max(at, end)
        end = start + n / WIRE_HZ
        if flush_at is not None and start >= flush_at:
            break
        segments.append((start, end if flush_at is None else min(end, flush_at)))
    return segments


class Mic:
    """20 ms frames against absolute deadlines (frame k holds capture time [t0 + k·20 ms, t0 + (k+1)·20 ms) and
    leaves at its end); silence unless a clip is due."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.t0 = time.monotonic()
        self._k = 0
        self._queue: list[tuple[float, Clip, asyncio.Future]] = []
        self.sent_at: dict[float, float] = {}  # a clip's onset -> when its first frame went out (due at onset + 20 ms)
        self._task = asyncio.create_task(self._run())

    def say(self, clip: Clip, at: float) -> asyncio.Future:
        """Speak `clip` from the first frame that starts at or after `at`; the future gets its onset time."""
        done = asyncio.get_running_loop().create_future()
        self._queue.append((at, clip, done))
        return done

    async def _run(self) -> None:
        n = int(FRAME_S * WIRE_HZ)
        pcm, pos = None, 0
        while True:
            start = self.t0 + self._k * FRAME_S
            onset = None
            if pcm is None and self._queue and start >= self._queue[0][0]:
                _, clip, done = self._queue.pop(0)
                pcm, pos, onset = clip.pcm, 0, start
                done.set_result(start)
            frame = np.zeros(n, np.float32)
            if pcm is not None:
                piece = pcm[pos: pos + n]
                frame[: piece.size] = piece
                pos += n
                if pos >= pcm.size:
                    pcm = None
            await asyncio.sleep(max(0.0, start + FRAME_S - time.monotonic()))
            pcm16 = np.clip(np.rint(frame * 32767), -32768, 32767).astype("<i2")
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(pcm16.tobytes()).decode()}))
            if onset is not None:
                self.sent_at[onset] = time.monotonic()
            self._k += 1

    def close(self) -> None:
        self._task.cancel()


async def _recv_until(ws, frames: list, kind: str, timeout: float, **match) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            frame = json.loads(await ws.recv())
            frames.append((time.monotonic(), frame))
            if frame["type"] == "error":
                raise RuntimeError(f"server error: {frame['error']}")
            if frame["type"] == kind and all(frame.get(k) == v for k, v in match.items()):
                return frame


async def listener_trial(url: str, plan: list[tuple[Clip, float]], reply_tokens: int, session: dict) -> dict:
    """One session: a reply of `reply_tokens`, each clip of `plan` spoken `offset` s after its first audio delta."""
    from websockets.asyncio.client import connect

    frames: list[tuple[float, dict]] = []
    async with connect(url, max_size=None) as ws:
        await _recv_until(ws, frames, "session.created", 30)
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": WIRE_HZ}},
                                          "output": {"format": {"type": "audio/pcm", "rate": WIRE_HZ}}},
            "realtime_ming": {"timing_events": True, **session}}}))
        await _recv_until(ws, frames, "session.updated", 30)
        mic = Mic(ws)
        try:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}}))
            created_at = time.monotonic()
            await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": reply_tokens}}))
            first = await _recv_until(ws, frames, "response.output_audio.delta", 120)
            first_at = frames[-1][0]
            reader = asyncio.create_task(_recv_until(ws, frames, "never", 3600))
            onsets = []
            for clip, offset in plan:
                onsets.append(await mic.say(clip, first_at + offset))
                await asyncio.sleep(clip.pcm.size / WIRE_HZ)
            async with asyncio.timeout(600):
                while not any(f["type"] == "response.done" for _, f in frames):
                    await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # the end of playback, a late speech_started
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            item_id = first["item_id"]
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
            retrieved = (await _recv_until(ws, frames, "conversation.item.retrieved", 30))["item"]
        finally:
            mic.close()
    return {"plan": plan, "onsets": onsets, "mic_sent": [mic.sent_at.get(t) for t in onsets],
            "frames": frames, "created_at": created_at, "first_at": first_at,
            "response_id": first["response_id"], "retrieved": retrieved}


def analyse_trial(trial: dict, sends: dict | None = None) -> tuple[list[dict], float | None]:
    """Per clip: its state at onset and what the listener heard; and when generation ended (None: it never did).
    `sends`: the server's send trace by response id (`read_sends`), for each interruption's drift."""
    frames, rid = trial["frames"], trial["response_id"]
    deltas = [(t, len(base64.b64decode(f["delta"])) // 2) for t, f in frames
              if f["type"] == "response.output_audio.delta" and f["response_id"] == rid]
    received = b"".join(base64.b64decode(f["delta"]) for _, f in frames
                        if f["type"] == "response.output_audio.delta" and f["response_id"] == rid)
    done_at, done = next((t, f["response"]) for t, f in frames
                         if f["type"] == "response.done" and f["response"]["id"] == rid)
    timings = next((f["timings"] for _, f in frames
                    if f["type"] == "realtime_ming.response.timings" and f["response_id"] == rid), {})
    gen_end = trial["created_at"] + timings["done"] / 1000.0 if "done" in timings else None
    whole = played(deltas, None)
    # a speech_started stops the reply while it is active or plays (after that it is the user's next turn)
    reply_end = max(whole[-1][1] if whole else trial["first_at"], done_at)
    started = [t for t, f in frames if f["type"] == "input_audio_buffer.speech_started"
               and trial["first_at"] < t < reply_end]
    flush_at = started[0] if started else None
    segments = played(deltas, flush_at)
    audio = trial["retrieved"]["content"][0].get("audio") if trial["retrieved"] else None
    finished = done["status"] == "completed" or (
        done["status"] == "incomplete" and (done.get("status_details") or {}).get("reason") == "max_output_tokens")
    complete = finished and flush_at is None and audio is not None and base64.b64decode(audio) == received
    rows = []
    for (clip, _), onset, mic_sent in zip(trial["plan"], trial["onsets"], trial.get("mic_sent") or [None] * len(trial["onsets"])):
        row = {"clip": clip.name, "kind": clip.kind, "onset_s": round(onset - trial["first_at"], 3),
               "state": "generating" if gen_end is None or gen_end > onset else "generated",
               "playing": any(a <= onset < b for a, b in segments)}
        end = onset + clip.pcm.size / WIRE_HZ
        if clip.kind == "interruption":
            last = max((b for _, b in segments), default=onset)
            row["stop_ms"] = round((last - onset) * 1000.0, 1) if row["playing"] else None
            row["detected"] = flush_at is not None
            # the stop's two parts: when the last delta the client played arrived (the server's hold or cancel) and
            # the audio the client still held then (the lead, plus any drift behind the server's clock)
            arrived = [at for at, _ in deltas[: len(segments)]]
            row["last_delta_ms"] = round((arrived[-1] - onset) * 1000.0, 1) if arrived and row["playing"] else None
            # the microphone's own lateness: its clip's first frame is due to go out at onset + 20 ms
            row["mic_late_ms"] = None if mic_sent is None else round((mic_sent - onset - FRAME_S) * 1000.0, 1)
            if sends is not None and row["playing"]:
                row["drift_ms"] = drift(deltas[: len(segments)], sends.get(rid))
                holds = [t for t in (sends.get(rid) or {}).get("holds", []) if t >= onset]
                row["hold_ms"] = round((holds[0] - onset) * 1000.0, 1) if holds else None
        else:
            # this clip stopped the reply if its speech_started came while it was spoken (or just after); a reply
            # that failed otherwise counts against every clip over it; once another clip stopped it, whether it
            # would have completed is unknown (None)
            row["stopped"] = any(onset < t < end + 1.5 for t in started) or (not finished and flush_at is None)
            row["complete"] = complete if flush_at is None or row["stopped"] else None
            gaps = [b0 - a1 for (_, a1), (b0, _) in zip(segments, segments[1:]) if onset - 0.1 <= a1 <= end + 2.0]
            row["pause_ms"] = round(max(gaps, default=0.0) * 1000.0, 1)
        rows.append(row)
    return rows, None if gen_end is None else gen_end - trial["first_at"]


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(round(q * (len(values) - 1))))], 1) if values else None


def summarise(rows: list[dict], pause_bound_ms: float = 800.0) -> dict:
    out = {}
    for state in STATES:
        mine = [r for r in rows if r["state"] == state]
        real = [r for r in mine if r["kind"] == "interruption"]
        stops = [r["stop_ms"] for r in real if r["stop_ms"] is not None and r["detected"]]
        heard = [r for r in real if r["stop_ms"] is not None and r["detected"] and r["last_delta_ms"] is not None]
        other = [r for r in mine if r["kind"] == "other" and r["playing"]]
        idle = sum(r["kind"] == "other" and not r["playing"] for r in mine)
        pauses = [r["pause_ms"] for r in other if not r["stopped"]]
        out[state] = {
            "interruptions": len(real), "not_playing_at_onset": sum(r["stop_ms"] is None for r in real),
            "missed": sum(not r["detected"] for r in real),
            "stop_ms_p50": _pct(stops, 0.5), "stop_ms_max": _pct(stops, 1.0),
            # the stop's parts: the last played delta's arrival after the onset, the audio the client held then
            "last_delta_ms_max": _pct([r["last_delta_ms"] for r in heard], 1.0),
            "held_ms_p50": _pct([r["stop_ms"] - r["last_delta_ms"] for r in heard], 0.5),
            "held_ms_max": _pct([r["stop_ms"] - r["last_delta_ms"] for r in heard], 1.0),
            "drift_ms_max": {side: _pct([r["drift_ms"][side] for r in heard if r.get("drift_ms")], 1.0)
                             for side in ("server", "client")},
            "mic_late_ms_max": _pct([r["mic_late_ms"] for r in real if r.get("mic_late_ms") is not None], 1.0),
            "hold_ms_max": _pct([r["hold_ms"] for r in heard if r.get("hold_ms") is not None], 1.0),
            "others": len(other), "others_not_playing_at_onset": idle, "others_stopped_reply": sum(r["stopped"] for r in other),
            "others_incomplete": sum(r["complete"] is False for r in other),
            "others_pause_over_bound": sum(p > pause_bound_ms for p in pauses),
            "pause_ms_p50": _pct(pauses, 0.5), "pause_ms_max": _pct(pauses, 1.0),
        }
    return out


def _plans(args, real: list[Clip], others: list[Clip], gen_after_first: float,
           audio_s: float) -> list[tuple[list, int]]:
    """Trials: (clips with their offsets after the first delta, reply tokens) for every clip in every state. A
    'generated' reply (as long as the warm-up's, `audio_s`) hosts as many non-interruptions as its playback after
    generation holds, 2.5 s each (at most `--per-reply`)."""
    later = max(args.generated_at_ms / 1000.0, gen_after_first + args.margin_ms / 1000.0)
    fits = int((audio_s - 2.5 - later) // (args.spacing_ms / 1000.0)) + 1
    plans: list[tuple[list, int]] = []
    for state in args.states:
        at = args.generating_at_ms / 1000.0 if state == "generating" else later
        tokens = args.short_reply_tokens if state == "generating" else args.reply_tokens
        plans += [([(c, at)], tokens) for c in real]
        step = 1 if state == "generating" else max(1, min(args.per_reply, fits))
        for i in range(0, len(others), step):
            group = others[i: i + step]
            plans.append(([(c, at + j * args.spacing_ms / 1000.0) for j, c in enumerate(group)], tokens))
    return plans


async def run_listener(args) -> dict:
    real, others = listener_clips()
    if args.only:
        real, others = ([c for c in clips if re.search(args.only, c.name)] for clips in (real, others))
    session = {} if args.lead_ms is None else {"output_lead_ms": None if args.lead_ms == "null" else int(args.lead_ms)}
    warm = await listener_trial(args.url, [], args.reply_tokens, session)  # how long generation and playback take
    _, gen = analyse_trial(warm)
    gen_after_first = 0.0 if gen is None else max(0.0, gen)
    audio_s = sum(len(base64.b64decode(f["delta"])) / 2 / WIRE_HZ for _, f in warm["frames"]
                  if f["type"] == "response.output_audio.delta")
    queue = asyncio.Queue()
    for plan in _plans(args, real, others, gen_after_first, audio_s):
        queue.put_nowait(plan)
    total = queue.qsize()
    trials: list[dict] = []
    failures: list[str] = []
    # each trial's rows as they come (a run cut short by a time limit still has them): OUT.rows.jsonl
    partial = Path(f"{args.out}.rows.jsonl") if args.out else None
    if partial is not None:
        partial.write_text("")

    async def worker() -> None:
        while not queue.empty():
            plan, tokens = queue.get_nowait()
            try:
                trials.append(await listener_trial(args.url, plan, tokens, session))
            except Exception as exc:  # one failed trial is reported, the run goes on
                failures.append(f"{[c.name for c, _ in plan]}: {exc!r}")
                continue
            if partial is not None and not args.trace_sends:
                with partial.open("a") as f:
                    f.writelines(json.dumps(row, default=str) + "\n" for row in analyse_trial(trials[-1])[0])
            print(f"trial {len(trials) + len(failures)}/{total} done", file=sys.stderr, flush=True)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    sends = read_sends(args.trace_sends) if args.trace_sends else None
    rows = [row for trial in trials for row in analyse_trial(trial, sends)[0]]
    return {"url": args.url, "concurrency": args.concurrency, "session": session,
            "generation_after_first_delta_s": round(gen_after_first, 3), "reply_audio_s": round(audio_s, 2),
            "summary": summarise(rows),
            "failures": failures, "clips": rows}


def listener_main(args) -> None:
    proc = None
    if args.serve is not None:
        if args.trace_sends:
            Path(args.trace_sends).write_text("")
        proc, args.url = serve_story(args.serve, STORY, args.trace_sends)
    client_nice = client_priority(args.client_nice) if args.client_nice is not None else None
    try:
        result = asyncio.run(run_listener(args))
        result["client_nice"] = client_nice
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(json.dumps({k: v for k, v in result.items() if k != "clips"}, indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole set (Silero is deterministic)")
    parser.add_argument("--min-speech-ms", default="64,300,500,700,900")
    listen = parser.add_argument_group("listener (a standard client through the real server)")
    listen.add_argument("--listener", action="store_true", help="measure what a listener hears (needs --url or --serve-tiny)")
    listen.add_argument("--url", help="ws://HOST:PORT/v1/realtime of a running server")
    listen.add_argument("--serve-tiny", dest="serve", action="store_const", const="",
                        help="start the embedded tiny model (CPU) in a child process, forced to tell a story")
    listen.add_argument("--serve", metavar="ARGS", help="start `realtime-ming serve ARGS` (e.g. '--config configs/"
                        "ming-flash-omni-2.0-x4.yaml --set engine.weights=dummy'), forced to tell a story")
    listen.add_argument("-c", "--concurrency", type=int, default=1, help="sessions at once")
    listen.add_argument("--states", default="generating,generated", help="which reply states to measure")
    listen.add_argument("--reply-tokens", type=int, default=300, help="reply length of the 'generated' trials")
    listen.add_argument("--short-reply-tokens", type=int, default=60, help="reply length of the 'generating' trials")
    listen.add_argument("--generating-at-ms", type=float, default=300.0, help="clip onset after the first delta")
    listen.add_argument("--generated-at-ms", type=float, default=1200.0,
                        help="earliest onset of a 'generated' clip (and at least the warm-up's generation time + margin)")
    listen.add_argument("--margin-ms", type=float, default=600.0)
    listen.add_argument("--per-reply", type=int, default=3, help="non-interruptions spoken over one 'generated' reply")
    listen.add_argument("--spacing-ms", type=float, default=2500.0, help="between them")
    listen.add_argument("--lead-ms", help="the session's realtime_ming.output_lead_ms (an integer or 'null'); default: the server's")
    listen.add_argument("--out", help="write every clip's row here (JSON)")
    listen.add_argument("--only", metavar="REGEX", help="only the clips whose name matches (e.g. 'okay|Wait')")
    listen.add_argument("--trace-sends", metavar="FILE", help="with --serve/--serve-tiny: the server logs when each "
                        "audio delta was counted as sent and written (bench.send_trace); each interruption's row then "
                        "splits the client's drift behind the server's clock into the server's and the client's part")
    listen.add_argument("--client-nice", type=int, default=None, help="this client's niceness (default: -10 with "
                        "--serve/--serve-tiny, the server started before at its own; as it is with --url)")
    args = parser.parse_args(argv)
    if args.client_nice is None and args.serve is not None:
        args.client_nice = -10
    if args.trace_sends and args.serve is None:
        parser.error("--trace-sends needs --serve or --serve-tiny")
    if args.listener:
        if not args.url and args.serve is None:
            parser.error("--listener needs --url, --serve or --serve-tiny")
        args.states = tuple(x for x in args.states.split(",") if x)
        listener_main(args)
        return
    vad = SileroVad(create_silero_session())
    command = shared_command_spotter()
    for _ in range(args.runs):
        for min_ms in (int(x) for x in args.min_speech_ms.split(",")):
            print(json.dumps(measure(TurnDetectorConfig(barge_in_min_speech_ms=min_ms), vad, command)), flush=True)


if __name__ == "__main__":
    main()
