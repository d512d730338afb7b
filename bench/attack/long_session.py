"""A long session: text turns far past the model's context under a `truncation` policy.

Acceptance with "auto" / retention_ratio: every response completes (`completed`, or `incomplete`
at max_output_tokens). With "disabled" the report shows where responses start failing (they must
fail with `context_length_exceeded`, never a generic error).
"""

from __future__ import annotations

import time

from .common import Client

__all__ = ["long_session"]


async def long_session(url: str, *, turns: int = 200, truncation="auto", max_output_tokens: int = 16,
                       api_key: str | None = None) -> dict:
    client = await Client.open(url, api_key)
    await client.send(type="session.update", session={
        "type": "realtime", "output_modalities": ["text"], "max_output_tokens": max_output_tokens,
        "truncation": truncation, "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    statuses: dict[str, int] = {}
    codes: dict[str, int] = {}
    input_tokens, cached_tokens = [], []
    start = time.perf_counter()
    try:
        for turn in range(turns):
            await client.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": f"This is turn {turn} of a long conversation; answer briefly."}]})
            await client.send(type="response.create")
            response = (await client.recv_until("response.done", timeout=120))["response"]
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
              "wall_s": round(time.perf_counter() - start, 1)}
    if truncation == "disabled":
        report["ok"] = set(codes) <= {"context_length_exceeded"}
    else:
        report["ok"] = answered == turns
    return report
