"""`python -m bench.attack`: run one attack driver against a server and print its JSON report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .barge import barge_ins
from .flood import flood
from .long_session import long_session
from .soak import soak
from .tools import tools_attack


def _truncation(text: str):
    return json.loads(text) if text.startswith("{") else text


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    if args.attack == "flood":
        coro = flood(args.url, audio_s=args.audio_s, append_s=args.append_s, max_p50_ms=args.max_p50_ms,
                     api_key=args.api_key)
    elif args.attack == "barge-in":
        coro = barge_ins(args.url, total=args.total, sessions=args.sessions, api_key=args.api_key)
    elif args.attack == "soak":
        coro = soak(args.url, sessions=args.sessions, concurrency=args.concurrency, pid=args.pid,
                    api_key=args.api_key, max_rss_growth_mib=args.max_rss_growth_mib, max_fd_growth=args.max_fd_growth)
    elif args.attack == "tools":
        coro = tools_attack(args.url, attacks=args.attacks, turns=args.turns, tools=args.tools,
                            max_ratio=args.max_ratio, pid=args.pid, api_key=args.api_key)
    else:
        coro = long_session(args.url, turns=args.turns, truncation=args.truncation,
                            max_output_tokens=args.max_output_tokens, context_tokens=args.context_tokens,
                            api_key=args.api_key)
    report = asyncio.run(coro)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
