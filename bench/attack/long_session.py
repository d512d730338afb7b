"""A long session: text turns far past the model's context under a `truncation` policy.

Acceptance with "auto" / retention_ratio: every response completes (`completed`, or `incomplete`
at max_output_tokens). With "disabled" the report shows where responses start failing (they must
fail with `context_length_exceeded`, never a generic error).

Prefix reuse (issue 43, finding 8): once the context is full, a turn prefills `input_tokens - cached_tokens`
new tokens; `cut_turns` are the turns that prefilled more than a quarter of `context_tokens` (a truncation cut
re-prefills the kept history), and `new_tokens_p50` / `new_tokens_max_uncut` show that the turns between cuts
prefill only their new messages. Turn latency (response.create -> response.done) is reported before and after
the context filled.
"""

from __future__ import annotations

import time

from .common import Client, percentile

__all__ = ["long_session"]


async def long_session(url: str, *, turns: int = 200, truncation="auto", max_output_tokens: int = 16,
                       context_tokens: int = 4096, api_key: str | None = None) -> dict:
    client = await Client.open(url, api_key)
    await client.send(type="session.update", session={
        "type": "realtime", "output_modalities": ["text"], "max_output_tokens": max_output_tokens,
        "truncation": truncation, "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    statuses: dict[str, int] = {}
    codes: dict[str, int] = {}
    input_tokens, cached_tokens, latencies = [], [], []
    start = time.perf_counter()
    try:
        for turn in range(turns):
            response, latency = await client.text_turn(f"This is turn {turn} of a long conversation; answer briefly.")
            latencies.append(latency)
            statuses[response["status"]] = statuses.get(response["status"], 0) + 1
            if response["status"] == "failed":
                code = (response.get("status_details") or {}).get("error", {}).get("code")
                codes[code] = codes.get(code, 0) + 1
            usage = response.get("usage") or {}
            input_tokens.append(usage.get("input_tokens", 0))
            cached_tokens.append((usage.get("input_token_details") or {}).get("cached_tokens", 0))
    finally:
        await client.close()
    answered = statuses.get("completed", 0) + statuses.get("incomplete", 0)
    report = {"turns": turns, "truncation": truncation, "statuses": statuses, "failure_codes": codes,
              "max_input_tokens": max(input_tokens, default=0),
              "cached_share": round(sum(cached_tokens) / max(1, sum(input_tokens)), 3),
              "wall_s": round(time.perf_counter() - start, 1), **_prefix_reuse(input_tokens, cached_tokens, latencies,
                                                                                 context_tokens)}
    if truncation == "disabled":
        report["ok"] = set(codes) <= {"context_length_exceeded"}
    else:
        report["ok"] = answered == turns
    return report


def _prefix_reuse(inputs: list[int], cached: list[int], latencies: list[float], context_tokens: int) -> dict:
    """New (prefilled) tokens per turn and turn latency, before and after the history first reached 3/4 of the
    largest prompt seen (the context is full from there on)."""
    if not inputs:
        return {}
    full_at = next(i for i, n in enumerate(inputs) if n >= 0.75 * max(inputs))
    new = [n - c for n, c in zip(inputs, cached)][full_at + 1:]
    quarter = context_tokens / 4
    uncut = [n for n in new if n <= quarter]
    after = latencies[full_at + 1:]
    return {"context_tokens": context_tokens, "full_at_turn": full_at, "turns_after_full": len(new),
            "cut_turns": len(new) - len(uncut), "new_tokens_p50": round(percentile(new, 50), 1) if new else None,
            "new_tokens_max_uncut": max(uncut, default=None), "new_tokens_mean": round(sum(new) / len(new), 1)
            if new else None, "turn_p50_s_before_full": round(percentile(latencies[:full_at + 1], 50), 3),
            "turn_p50_s_after_full": round(percentile(after, 50), 3) if after else None,
            "turn_mean_s_after_full": round(sum(after) / len(after), 3) if after else None}
