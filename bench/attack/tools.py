"""Oversized tools: one client sends `session.update` and `response.create` with 128 tools at every protocol size
limit (~9.4 MB a frame) while another session takes text turns and /health is polled (issue 43, finding 2).

Acceptance: every attack is refused where it comes in (`REFUSALS`: the frame over the control-frame cap, the tools
over their size limit or over the context; no response started), and the other session's turn latency p50 and /health p99 during the
attack stay within `max_ratio` x their baseline (measured just before, same server, same turns).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from multiprocessing.connection import Connection

from .common import Client, HealthProbe, ProcessGauge, health_address, percentile

__all__ = ["REFUSALS", "big_tools", "tools_attack"]

# How the server may refuse the attack's frames (`code@param`): either frame over the control-frame cap (the
# response.create carries no media), the tools over their size limit, or (a server with larger caps) the tools over
# the context.
REFUSALS = frozenset({"event_frame_too_large@type", "tools_too_large@session.tools",
                      "tools_too_large@response.tools", "instructions_exceed_context@session.tools",
                      "instructions_exceed_context@response.tools"})


def big_tools(count: int = 128) -> list[dict]:
    """`count` function tools, each with an 8 KiB description and a JSON schema just under 64 KiB."""
    properties = {f"p{k}": {"type": "string", "description": "word " * 120} for k in range(100)}
    return [{"type": "function", "name": f"tool_{i}", "description": "d " * 4096,
             "parameters": {"type": "object", "properties": properties}} for i in range(count)]


async def _turns(url: str, turns: int, api_key: str | None, max_output_tokens: int) -> list[float]:
    """Latency (s) of `turns` text turns of a fresh session: response.create sent -> response.done."""
    client = await Client.open(url, api_key)
    try:
        await client.send(type="session.update", session={
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": max_output_tokens,
            "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        latencies = []
        for turn in range(turns):
            response, latency = await client.text_turn(f"Turn {turn}: answer briefly.")
            latencies.append(latency)
            if response["status"] not in ("completed", "incomplete"):
                raise RuntimeError(f"victim turn {turn} ended {response['status']}: {response.get('status_details')}")
        return latencies
    finally:
        await client.close()


async def _attack(url: str, attacks: int, update: str, create: str, api_key: str | None) -> dict:
    """`attacks` rounds of the session.update and response.create frames; the error codes and params answered."""
    client = await Client.open(url, api_key)
    answers: dict[str, int] = {}
    started = 0
    try:
        await client.send(type="session.update", session={
            "type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}})
        await client.recv_until("session.updated")
        await client.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Use the tools."}]})
        await client.recv_until("conversation.item.done")
        for _ in range(attacks):
            await client.ws.send(update)
            await client.ws.send(create)
            for _ in range(2):
                frame = await client.recv_until("error", "session.updated", "response.created", timeout=120)
                if frame["type"] == "error":
                    key = f"{frame['error']['code']}@{frame['error']['param']}"
                else:
                    key = frame["type"]
                    started += frame["type"] == "response.created"
                answers[key] = answers.get(key, 0) + 1
    finally:
        await client.close()
    return {"answers": answers, "responses_started": started}


def _attacker(conn: Connection, url: str, attacks: int, count: int, api_key: str | None) -> None:
    """The attacking client, in a process of its own: sending a 9 MB frame takes a client's event loop ~0.1 s
    (framing and masking it), which in the driver's process would stall the victim's and the /health probe's
    timings too. Its frames are built before it reports ready; it attacks when told to go."""
    tools = big_tools(count)
    update = json.dumps({"type": "session.update", "session": {"type": "realtime", "tools": tools}})
    create = json.dumps({"type": "response.create", "response": {"tools": tools}})
    conn.send("ready")
    conn.recv()
    try:
        conn.send(asyncio.run(_attack(url, attacks, update, create, api_key)))
    except Exception as exc:  # noqa: BLE001 -- reported to the driver, which fails the attack
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


async def tools_attack(url: str, *, attacks: int = 5, turns: int = 10, tools: int = 128, max_output_tokens: int = 8,
                       max_ratio: float = 2.0, pid: int | None = None, api_key: str | None = None) -> dict:
    """Baseline (another session's `turns` turns, /health polled), then the same during `attacks` attack rounds;
    with the server's `pid`, its RSS before and after (MiB)."""
    gauge = ProcessGauge(pid) if pid is not None else None
    rss_before = gauge.rss_mib() if gauge is not None else None
    host, port = health_address(url)

    loop = asyncio.get_running_loop()
    conn, child_conn = multiprocessing.get_context("spawn").Pipe()
    attacker = multiprocessing.get_context("spawn").Process(target=_attacker, args=(
        child_conn, url, attacks, tools, api_key), daemon=True)
    attacker.start()

    async def attack_round() -> dict:
        conn.send("go")
        result = await loop.run_in_executor(None, conn.recv)
        if "error" in result:
            raise RuntimeError(f"the attacker failed: {result['error']}")
        return result

    async def phase(attack: bool) -> tuple[list[float], HealthProbe, dict | None]:
        probe, stop = HealthProbe(host, port), asyncio.Event()
        poller = asyncio.create_task(probe.run(stop))
        try:
            if attack:
                victim, attacked = await asyncio.gather(_turns(url, turns, api_key, max_output_tokens),
                                                        attack_round())
            else:
                victim, attacked = await _turns(url, turns, api_key, max_output_tokens), None
        finally:
            stop.set()
            await poller
        return victim, probe, attacked

    try:
        await loop.run_in_executor(None, conn.recv)  # the attacker's frames are ready
        await _turns(url, 2, api_key, max_output_tokens)  # warm-up
        base_turns, base_health, _ = await phase(False)
        hit_turns, hit_health, attacked = await phase(True)
    finally:
        attacker.join(timeout=10)
        if attacker.is_alive():
            attacker.kill()
    assert attacked is not None

    def summary(turns_s: list[float], probe: HealthProbe) -> dict:
        return {"turn_p50_s": round(percentile(turns_s, 50), 3), "turn_max_s": round(max(turns_s), 3),
                "health_p99_ms": round(percentile(probe.latencies_ms, 99), 2), "health_n": len(probe.latencies_ms),
                "health_failures": probe.failures}

    report = {"attacks": attacks, "tools": tools, "baseline": summary(base_turns, base_health),
              "attack": summary(hit_turns, hit_health), **attacked}
    if gauge is not None:
        report["rss_mib"] = {"before": round(rss_before, 1), "after": round(gauge.rss_mib(), 1)}
    b, a = report["baseline"], report["attack"]
    report["turn_ratio"] = round(a["turn_p50_s"] / b["turn_p50_s"], 2)
    report["health_ratio"] = round(a["health_p99_ms"] / b["health_p99_ms"], 2)
    report["refused_where_sent"] = (attacked["responses_started"] == 0 and sum(attacked["answers"].values()) == 2 * attacks
                                    and all(key in REFUSALS for key in attacked["answers"]))
    report["ok"] = (report["refused_where_sent"] and not a["health_failures"] and report["turn_ratio"] <= max_ratio
                    and report["health_ratio"] <= max_ratio)
    return report
