"""`python -m bench.attack`: run one attack driver (or `all` of them) against a server and print its JSON report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from .barge import barge_ins
from .drain import drain
from .flood import flood
from .http_bodies import http_bodies
from .image_stall import image_stall
from .long_session import long_session
from .soak import soak
from .voices import voice_eviction, voice_starvation
from .tools import tools_attack


def _truncation(text: str):
    return json.loads(text) if text.startswith("{") else text


def _keys(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if len(keys) < 2:
        raise argparse.ArgumentTypeError("give at least two API keys, comma-separated")
    return keys


def _sigterm(pid: int):
    return lambda: os.kill(pid, signal.SIGTERM)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.attack", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    parser.add_argument("--api-key", default=None)
    sub = parser.add_subparsers(dest="attack", required=True)
    p = sub.add_parser("flood", help="unpaced audio under server VAD while /health is polled")
    p.add_argument("--audio-s", type=float, default=600.0)
    p.add_argument("--append-s", type=float, default=1.0)
    p.add_argument("--max-p50-ms", type=float, default=20.0)
    p = sub.add_parser("barge-in", help="interrupt replies mid-stream; 0 failed responses")
    p.add_argument("--total", type=int, default=1000)
    p.add_argument("--sessions", type=int, default=4)
    p = sub.add_parser("soak", help="sessions of one turn each; server RSS and fds flat")
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--pid", type=int, required=True, help="the server's process id (RSS and fds from /proc)")
    p.add_argument("--max-rss-growth-mib", type=float, default=64.0)
    p.add_argument("--max-fd-growth", type=int, default=8)
    p = sub.add_parser("long-session", help="text turns far past the context under a truncation policy")
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--truncation", type=_truncation, default="auto", help='auto | disabled | a JSON object')
    p.add_argument("--max-output-tokens", type=int, default=16)
    p.add_argument("--context-tokens", type=int, default=4096, help="the server's engine.thinker.max_seq_len")
    p = sub.add_parser("tools", help="128 tools at every size limit while another session takes turns")
    p.add_argument("--attacks", type=int, default=5)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--tools", type=int, default=128)
    p.add_argument("--max-ratio", type=float, default=2.0)
    p.add_argument("--pid", type=int, default=None, help="the server's process id (its RSS from /proc)")
    p = sub.add_parser("voices", help="bodiless uploads and registrations past quota: 0 cross-key 429 / eviction")
    p.add_argument("--api-keys", type=_keys, required=True, help="the server's keys, comma-separated (>= 2)")
    p.add_argument("--hold", type=int, default=6)
    p.add_argument("--victim-voices", type=int, default=3)
    p.add_argument("--per-key", type=int, default=16)
    p = sub.add_parser("http-bodies", help="odd bodies on every HTTP route: 0 HTTP 5xx")
    p.add_argument("--fuzz", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("image", help="a big legal image: other sessions' event gap <= --max-gap-s")
    p.add_argument("--side", type=int, default=2048)
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--max-gap-s", type=float, default=1.0)
    p = sub.add_parser("drain", help="SIGTERM with replies running: response.done before every 1001 close")
    p.add_argument("--pid", type=int, required=True, help="the server's process id (it gets SIGTERM)")
    p.add_argument("--sessions", type=int, default=4)
    p = sub.add_parser("all", help="every attack at moderate sizes, the drain last (it stops the server)")
    p.add_argument("--pid", type=int, required=True, help="the server's process id")
    p.add_argument("--api-keys", type=_keys, required=True, help="the server's keys, comma-separated (>= 2)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every attack's size")
    return parser


async def _voices(url: str, keys: list[str], hold: int, victim_voices: int, per_key: int) -> dict:
    starvation = await voice_starvation(url, attacker_key=keys[0], victim_keys=keys[1:], hold=hold)
    eviction = await voice_eviction(url, keys=keys, victim_voices=victim_voices, per_key=per_key)
    return {"starvation": starvation, "eviction": eviction, "ok": starvation["ok"] and eviction["ok"]}


async def _all(url: str, pid: int, keys: list[str], scale: float) -> dict:
    key, n = keys[0], lambda size: max(1, int(size * scale))
    runs = {
        "flood": lambda: flood(url, audio_s=n(120), api_key=key),
        "barge-in": lambda: barge_ins(url, total=n(200), sessions=4, api_key=key),
        "soak": lambda: soak(url, sessions=n(200), concurrency=4, pid=pid, api_key=key),
        # ~95 tokens a turn: 100 turns pass the tiny model's 4,096-token context and several `auto` cuts (40 never did)
        "long-session": lambda: long_session(url, turns=n(100), truncation="auto", max_output_tokens=16, api_key=key),
        "tools": lambda: tools_attack(url, attacks=n(5), turns=n(10), tools=128, max_ratio=2.0, pid=pid, api_key=key),
        "voices": lambda: _voices(url, keys, hold=6, victim_voices=3, per_key=n(16)),
        "http-bodies": lambda: http_bodies(url, api_key=key, fuzz=n(2000)),
        "image": lambda: image_stall(url, side=2048, api_key=key),
        "drain": lambda: drain(url, _sigterm(pid), sessions=4, api_key=key),
    }
    reports = {}
    for name, run in runs.items():
        try:
            reports[name] = await run()
        except Exception as exc:  # one attack's crash is its failure, the others still run
            reports[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {'ok' if reports[name]['ok'] else 'FAILED'}", file=sys.stderr, flush=True)
    reports["ok"] = all(r["ok"] for r in reports.values())
    return reports


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    url, key = args.url, args.api_key
    if args.attack == "flood":
        coro = flood(url, audio_s=args.audio_s, append_s=args.append_s, max_p50_ms=args.max_p50_ms, api_key=key)
    elif args.attack == "barge-in":
        coro = barge_ins(url, total=args.total, sessions=args.sessions, api_key=key)
    elif args.attack == "soak":
        coro = soak(url, sessions=args.sessions, concurrency=args.concurrency, pid=args.pid, api_key=key,
                    max_rss_growth_mib=args.max_rss_growth_mib, max_fd_growth=args.max_fd_growth)
    elif args.attack == "long-session":
        coro = long_session(url, turns=args.turns, truncation=args.truncation,
                            max_output_tokens=args.max_output_tokens, context_tokens=args.context_tokens, api_key=key)
    elif args.attack == "tools":
        coro = tools_attack(url, attacks=args.attacks, turns=args.turns, tools=args.tools,
                            max_ratio=args.max_ratio, pid=args.pid, api_key=key)
    elif args.attack == "voices":
        coro = _voices(url, args.api_keys, args.hold, args.victim_voices, args.per_key)
    elif args.attack == "http-bodies":
        coro = http_bodies(url, api_key=key, fuzz=args.fuzz, seed=args.seed)
    elif args.attack == "image":
        coro = image_stall(url, side=args.side, sessions=args.sessions, max_gap_s=args.max_gap_s, api_key=key)
    elif args.attack == "drain":
        coro = drain(url, _sigterm(args.pid), sessions=args.sessions, api_key=key)
    else:
        coro = _all(url, args.pid, args.api_keys, args.scale)
    report = asyncio.run(coro)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
