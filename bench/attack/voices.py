"""Voice registration across API keys: one key must never cost another its registrations or its voices.

`voice_starvation`: the attacker key opens `hold` connections that send a registration's head and never its
body; meanwhile every victim key registers a voice. Acceptance: 0 victim registrations refused (429 or any
other non-200), 0 HTTP 5xx; the held connections end with the attacker's own 429 / 408.
`voice_eviction`: the victim key registers `victim_voices` voices, then every other key registers `per_key`
(past its quota). Acceptance: all the victim's voices are still there (0 cross-key evictions), no registration
refused for another key's sake (409 `voice_store_full`, 429), 0 HTTP 5xx.
Both need a server with `server.auth.api_keys` set to the keys given (without keys every caller is one owner).
"""

from __future__ import annotations

import asyncio
import collections
import time

from .common import health_address
from .raw_http import exchange, request, voice_json, voice_wav

__all__ = ["voice_eviction", "voice_starvation"]

VOICES_PATH = "/v1/realtime/voices"
_TRANSCRIPT = "This is a test of my own voice."


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def register(host: str, port: int, key: str, seed: int = 0, timeout_s: float = 60.0):
    """POST one voice (JSON body) as `key` -> the answer."""
    body = voice_json(_TRANSCRIPT, voice_wav(seed=seed))
    raw = request("POST", VOICES_PATH, headers={**_auth(key), "Content-Type": "application/json"}, body=body)
    return await exchange(host, port, raw, timeout_s)


async def voice_starvation(url: str, *, attacker_key: str, victim_keys: list[str], hold: int = 6,
                           body_bytes: int = 1_000_000, timeout_s: float = 30.0) -> dict:
    """`hold` bodiless registrations of `attacker_key` while each of `victim_keys` registers one voice."""
    host, port = health_address(url)
    head = request("POST", VOICES_PATH, headers={**_auth(attacker_key), "Content-Type": "application/json",
                                                   "Content-Length": str(body_bytes)})
    held = [asyncio.create_task(exchange(host, port, head, timeout_s)) for _ in range(hold)]
    await asyncio.sleep(0.5)  # the heads are in
    started = time.perf_counter()
    victims = await asyncio.gather(*(register(host, port, key, seed=i) for i, key in enumerate(victim_keys)))
    victim_s = time.perf_counter() - started
    attacker = await asyncio.gather(*held)
    statuses = collections.Counter(str(a.status) for a in attacker)
    codes = collections.Counter(a.code for a in attacker)
    refused = [(key, a.status, a.code) for key, a in zip(victim_keys, victims) if a.status != 200]
    server_errors = sum(1 for a in [*victims, *attacker] if a.status is not None and a.status >= 500)
    report = {"hold": hold, "victims": len(victim_keys), "victims_ok": len(victim_keys) - len(refused),
              "cross_key_429": sum(1 for _, status, _ in refused if status == 429), "victims_refused": refused,
              "victim_s": round(victim_s, 2), "attacker_statuses": dict(statuses), "attacker_codes": dict(codes),
              "http_5xx": server_errors}
    report["ok"] = not refused and not server_errors and statuses.get("None", 0) == 0
    return report


async def voice_eviction(url: str, *, keys: list[str], victim_voices: int = 3, per_key: int = 16,
                         concurrency: int = 2) -> dict:
    """keys[0] registers `victim_voices`, then keys[1:] register `per_key` each (`concurrency` keys at once)."""
    host, port = health_address(url)
    victim, others = keys[0], keys[1:]
    mine = []
    answers = collections.Counter()
    for i in range(victim_voices):
        answer = await register(host, port, victim, seed=i)
        answers[f"{answer.status} {answer.code or ''}".strip()] += 1
        if answer.status == 200:
            mine.append(answer.json()["id"])
    listed = await exchange(host, port, request("GET", VOICES_PATH, headers=_auth(victim)))
    held = {v.get("id") for v in listed.json().get("data", [])}
    if not set(mine) <= held:  # the key's own quota is smaller: choose fewer victim voices
        return {"ok": False, "error": f"the victim key keeps {len(held)} of its {len(mine)} voices before any other "
                                      "key registers: victim_voices is above the key's quota"}
    gate = asyncio.Semaphore(concurrency)

    async def fill(key: str, k: int) -> None:
        async with gate:
            for n in range(per_key):
                answer = await register(host, port, key, seed=1000 * k + n)
                answers[f"{answer.status} {answer.code or ''}".strip()] += 1

    await asyncio.gather(*(fill(key, k) for k, key in enumerate(others, 1)))
    missing = []
    for voice_id in mine:
        answer = await exchange(host, port, request("GET", f"{VOICES_PATH}/{voice_id}", headers=_auth(victim)))
        if answer.status != 200:
            missing.append((voice_id, answer.status, answer.code))
    refused_for_others = sum(n for k, n in answers.items() if k.startswith(("409", "429")))
    server_errors = sum(n for k, n in answers.items() if k[:1] == "5")
    report = {"keys": len(keys), "victim_voices": victim_voices, "victim_registered": len(mine),
              "per_key": per_key, "registrations": dict(answers), "cross_key_evictions": len(missing),
              "missing": missing, "refused_for_others": refused_for_others, "http_5xx": server_errors}
    report["ok"] = len(mine) == victim_voices and not missing and not refused_for_others and not server_errors
    return report
