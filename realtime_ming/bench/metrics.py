"""From raw turn timelines to samples and summaries: TTFA, playback continuity, RTF, barge-in stop latency.

Definitions: TTFA_user = last non-silent input sample → first audio
delta received; TTFA_server = `speech_stopped` (VAD) or `committed` (manual) received → first
audio delta received (both server→client, so transport mostly cancels); RTF = (last audio delta −
speech end) / audio seconds (vllm-omni's realtime definition). The simulated player starts at
the first delta and plays each delta's samples at the wire rate; an underrun is the time it
waits with an empty buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .trace import ResponseTrace, TurnTrace

__all__ = [
    "PERCENTILES",
    "STAGE_ORDER",
    "UNDERRUN_THRESHOLDS_MS",
    "compare",
    "percentiles",
    "play",
    "stage_order",
    "summarise",
    "turn_sample",
]

PERCENTILES = (50, 90, 99)
UNDERRUN_THRESHOLDS_MS = (50, 100, 200)
_SUMMARY_METRICS = ("ttfa_user_s", "created_user_s", "ttfa_server_s", "ttft_user_s", "ttfa_server_reported_s", "vad_delay_s",
                    "max_gap_s", "underrun_max_s", "rtf", "stream_rtf", "audio_s")
# Our server's timing-event keys along the data path; `confirmed` is the VAD's end-of-turn decision
# (a speculative turn starts before it), `response_done` the session's response.done.
STAGE_ORDER = ("submitted", "encoders_done", "prefill_done", "first_token", "first_segment", "first_talker_step",
               "first_pcm", "first_audio_delta", "thinker_done", "done", "response_done", "confirmed")
_BARGE_METRICS = ("stop_last_delta_s", "stop_done_s", "detect_s")


def play(arrivals: Sequence[float], num_samples: Sequence[int], rate_hz: int) -> list[float]:
    """Underruns (s) of a player that starts at the first arrival and never skips audio."""
    underruns: list[float] = []
    play_end = None
    for t, n in zip(arrivals, num_samples):
        if play_end is None:
            play_end = t
        elif t > play_end:
            underruns.append(t - play_end)
            play_end = t
        play_end += n / rate_hz
    return underruns


def _first_after(times: Iterable[float], t0: float) -> float | None:
    return next((t for t in times if t >= t0), None)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _response_metrics(r: ResponseTrace, speech_end: float, rate_hz: int) -> dict[str, Any]:
    audio_s = sum(r.audio_num_samples) / rate_hz
    first = r.audio_at[0] if r.audio_at else None
    last = r.audio_at[-1] if r.audio_at else None
    gaps = np.diff(r.audio_at) if len(r.audio_at) > 1 else np.zeros(0)
    underruns = play(r.audio_at, r.audio_num_samples, rate_hz)
    out: dict[str, Any] = {
        "ttfa_user_s": _diff(first, speech_end),
        "ttft_user_s": _diff(r.first_text_at, speech_end),
        "created_user_s": _diff(r.created_at, speech_end),  # end of speech → response.created
        "audio_s": audio_s,
        "num_chunks": len(r.audio_at),
        "max_gap_s": float(gaps.max()) if gaps.size else None,
        "underrun_max_s": max(underruns, default=0.0) if r.audio_at else None,
        "underrun_total_s": float(sum(underruns)),
        "rtf": _diff(last, speech_end) / audio_s if audio_s > 0 else None,
        "stream_rtf": (last - first) / audio_s if audio_s > 0 else None,
        "response_status": r.status,
        "response_reason": r.reason,
        "num_deltas_after_done": r.num_deltas_after_done,
        "stages_ms": r.timings,
        "ttfa_server_reported_s": None,
        "chunks": {
            "at_ms": [round((t - speech_end) * 1000.0, 3) for t in r.audio_at],
            "num_samples": list(r.audio_num_samples),
        },
    }
    for ms in UNDERRUN_THRESHOLDS_MS:
        out[f"num_underruns_over_{ms}ms"] = sum(u > ms / 1000.0 for u in underruns)
    if r.timings is not None and "first_audio_delta" in r.timings:
        out["ttfa_server_reported_s"] = r.timings["first_audio_delta"] / 1000.0
    return out


def _barge_metrics(trace: TurnTrace, first: ResponseTrace) -> tuple[dict[str, Any], str | None]:
    """Stop latency of the interrupted response and whether the interruption went right."""
    started = _first_after(trace.speech_started_at, trace.barge_start_at)
    followups = trace.responses[1:]
    barge = {
        "turn": trace.barge_turn_name,
        "missed": _is_finished(first.status, first.reason) and (started is None or (first.done_at or 0.0) <= started),
        "detect_s": _diff(started, trace.barge_start_at),
        "stop_last_delta_s": None,
        "stop_done_s": None,
        "cancelled": first.status == "cancelled",
        "num_deltas_after_done": first.num_deltas_after_done,
        "followup_status": followups[-1].status if followups else None,
    }
    if not barge["missed"] and started is not None and first.done_at is not None:
        last = first.audio_at[-1] if first.audio_at else started
        barge["stop_last_delta_s"] = max(0.0, last - started)
        barge["stop_done_s"] = first.done_at - started
    failure = None
    if started is None:
        failure = "barge_in_not_detected"
    elif not barge["missed"] and not barge["cancelled"]:
        failure = f"interrupted_status={first.status}"
    elif not followups or not _is_finished(followups[-1].status, followups[-1].reason):
        failure = "barge_in_followup_failed"
    return barge, failure


def _is_finished(status: str | None, reason: str | None) -> bool:
    """A response that ran to its end: completed, or cut by max_output_tokens (a benchmark's length cap)."""
    return status == "completed" or (status == "incomplete" and reason == "max_output_tokens")


def _failure(trace: TurnTrace, sample: dict[str, Any], allow_silent: bool) -> str | None:
    if trace.failure is not None:
        return trace.failure
    if trace.errors:
        return f"error:{trace.errors[0]['code']}"
    expected = 1 if trace.barge_start_at is None else 2
    if len(trace.responses) != expected:
        return f"num_responses={len(trace.responses)}"
    if trace.barge_start_at is None and not _is_finished(sample["response_status"], sample["response_reason"]):
        return f"status={sample['response_status']}"
    if not sample["num_chunks"] and not allow_silent:
        return "no_audio"
    if sample["num_deltas_after_done"]:
        return "audio_after_done"
    return None


def turn_sample(trace: TurnTrace, rate_hz: int, *, allow_silent: bool = False) -> dict[str, Any]:
    """One JSON-ready sample of a turn; `ok` is False with a `failure` reason when anything went wrong.

    A response that ends without audio is `is_silent`; it fails the turn (`no_audio`) unless
    `allow_silent` (random-weight models often say nothing speakable).
    """
    sample: dict[str, Any] = {
        "session": trace.session_index,
        "turn_index": trace.turn_index,
        "turn": trace.turn_name,
        "is_warmup": trace.is_warmup,
        "speech_end_offset_s": trace.speech_end_offset_s,
        "max_send_lag_s": trace.max_send_lag_s,
        "errors": trace.errors,
        "num_responses": len(trace.responses),
    }
    speech_end = trace.speech_end_at
    first = trace.responses[0] if trace.responses else None
    if first is not None and speech_end is not None:
        sample.update(_response_metrics(first, speech_end, rate_hz))
        stopped = trace.committed_at[0] if trace.commit_sent_at is not None and trace.committed_at else (
            trace.speech_stopped_at[0] if trace.speech_stopped_at else None)
        sample["ttfa_server_from"] = "committed" if trace.commit_sent_at is not None else "speech_stopped"
        sample["ttfa_server_s"] = _diff(first.audio_at[0] if first.audio_at else None, stopped)
        sample["vad_delay_s"] = _diff(trace.speech_stopped_at[0] if trace.speech_stopped_at else None, speech_end)
    barge_failure = None
    if trace.barge_start_at is not None and first is not None:
        sample["barge"], barge_failure = _barge_metrics(trace, first)
    failure = _failure(trace, sample, allow_silent) if first is not None and speech_end is not None else (
        trace.failure or "no_response")
    sample["is_silent"] = first is not None and first.done_at is not None and not first.audio_at
    sample["failure"] = failure or barge_failure
    sample["ok"] = sample["failure"] is None
    return sample


def percentiles(values: Iterable[float | None]) -> dict[str, float | None]:
    """p50/p90/p99 and mean of the non-None values (None when there are none)."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    keys = [f"p{p}" for p in PERCENTILES] + ["mean"]
    if data.size == 0:
        return dict.fromkeys(keys)
    out = {f"p{p}": float(np.percentile(data, p)) for p in PERCENTILES}
    out["mean"] = float(data.mean())
    return out


def stage_order(names: Iterable[str]) -> list[str]:
    """`names` in data-path order (`STAGE_ORDER`), unknown stages after it in their given order."""
    names = list(dict.fromkeys(names))
    known = [n for n in STAGE_ORDER if n in names]
    return known + [n for n in names if n not in STAGE_ORDER]


def _stage_medians(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median ms of every server stage seen, in data-path order."""
    by_stage: dict[str, list[float]] = {}
    for s in samples:
        for stage, ms in (s.get("stages_ms") or {}).items():
            by_stage.setdefault(stage, []).append(ms)
    return {stage: float(np.median(by_stage[stage])) for stage in stage_order(by_stage)}


def summarise(samples: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Statistics of one (target, concurrency) group over its measured (non-warmup) turns."""
    measured = [s for s in samples if not s["is_warmup"]]
    ok = [s for s in measured if s["ok"]]
    summary: dict[str, Any] = {
        "num_turns": len(measured),
        "num_ok": len(ok),
        "num_silent": sum(s["is_silent"] for s in ok),
        "success_rate": len(ok) / len(measured) if measured else None,
        "failures": sorted({s["failure"] for s in measured if s["failure"]}),
        "num_errors": sum(len(s["errors"]) for s in measured),
        "wall_s": wall_s,
        "audio_s_per_wall_s": sum(s.get("audio_s") or 0.0 for s in measured) / wall_s if wall_s > 0 else None,
        "max_send_lag_s": max((s["max_send_lag_s"] for s in measured), default=0.0),
    }
    plain = [s for s in ok if "barge" not in s]  # an interrupted response has no meaningful continuity
    for name in _SUMMARY_METRICS:
        summary[name] = percentiles(s.get(name) for s in (plain if name in ("max_gap_s", "underrun_max_s",
                                                                            "rtf", "stream_rtf", "audio_s") else ok))
    multi = [s for s in plain if (s.get("num_chunks") or 0) > 1]
    for ms in UNDERRUN_THRESHOLDS_MS:
        summary[f"c{ms}"] = (sum(s["underrun_max_s"] <= ms / 1000.0 for s in multi) / len(multi)) if multi else None
        summary[f"num_underruns_over_{ms}ms"] = sum(s.get(f"num_underruns_over_{ms}ms", 0) for s in plain)
    barges = [s["barge"] for s in ok if "barge" in s]
    if barges:
        summary["barge"] = {name: percentiles(b[name] for b in barges) for name in _BARGE_METRICS}
        summary["barge"]["num_missed"] = sum(b["missed"] for b in barges)
        summary["barge"]["num_measured"] = sum(b["stop_done_s"] is not None for b in barges)
    summary["stages_ms_p50"] = _stage_medians(ok)
    return summary


def compare(base: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """other / base for the TTFA percentiles and throughput of two summaries (< 1: `other` is faster)."""
    ratios: dict[str, float | None] = {}
    for name in ("ttfa_user_s", "ttfa_server_s", "ttft_user_s"):
        for p in PERCENTILES:
            a, b = base[name][f"p{p}"], other[name][f"p{p}"]
            ratios[f"{name}.p{p}"] = b / a if a and b is not None else None
    a, b = base["audio_s_per_wall_s"], other["audio_s_per_wall_s"]
    ratios["audio_s_per_wall_s"] = b / a if a and b is not None else None
    return ratios
