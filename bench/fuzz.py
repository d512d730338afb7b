"""Protocol fuzzer: `python -m bench.fuzz --frames 10000` against a server on loopback.

Without `--url` it starts our server in this process on the embedded tiny model (CPU) with a
small frame limit, so that oversize frames are cheap, and watches its log. `--sessions` sessions
(one of them beta) each send their share of `fuzz_frames` frames; after every frame a probe
(`conversation.item.retrieve` of a missing item) marks where that frame's answers end, so each
frame is judged on exactly the events it caused. A canary session runs normal text turns the
whole time. At the end every fuzzed session must complete one more normal turn.

Checked: 0 sessions lost (closed or dropped), 0 tracebacks and 0 handler failures logged, every
invalid frame answered by exactly one `error` with its specific code (param and `event_id` echo
where the attack knows them), no frame answered by more than one error or by `server_error`,
every server frame valid for the `openai` package's event types of its dialect. Exit code 0 when
all hold. Results: JSON on stdout (and `--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime_ming.protocol.dialect import Dialect

from .fuzz_frames import ANY, PROBE_ITEM_ID, FrameGenerator, FuzzFrame

__all__ = ["FuzzReport", "capture_logs", "main", "run_fuzz", "serve_tiny"]

Validator = Callable[[dict, Dialect], None]
_READ_TIMEOUT_S = 60.0  # one frame's answers (a busy engine only delays response events)
_MAX_VIOLATIONS = 50  # kept in the report, with the frame that caused each


@dataclass
class FuzzReport:
    """Counts of one run; `ok` when every acceptance check holds."""

    frames: int = 0
    frames_by_kind: Counter = field(default_factory=Counter)
    errors_by_code: Counter = field(default_factory=Counter)
    server_frames: int = 0
    invalid_server_frames: int = 0
    sessions_lost: int = 0
    violations: list[str] = field(default_factory=list)
    num_violations: int = 0
    canary_turns: Counter = field(default_factory=Counter)
    final_turns: Counter = field(default_factory=Counter)
    log: Counter = field(default_factory=Counter)  # records by level, "traceback", "failure"
    wall_s: float = 0.0

    def violation(self, message: str) -> None:
        self.num_violations += 1
        if len(self.violations) < _MAX_VIOLATIONS:
            self.violations.append(message)

    @property
    def ok(self) -> bool:
        return (
            self.num_violations == 0 and self.sessions_lost == 0 and self.invalid_server_frames == 0
            and self.log["traceback"] == 0 and self.log["failure"] == 0
            and set(self.final_turns) <= {"completed", "incomplete"}
            and set(self.canary_turns) <= {"completed", "incomplete"}
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "frames": self.frames, "wall_s": round(self.wall_s, 2),
            "frames_by_kind": dict(sorted(self.frames_by_kind.items())),
            "errors_by_code": dict(sorted(self.errors_by_code.items())),
            "server_frames": self.server_frames, "invalid_server_frames": self.invalid_server_frames,
            "sessions_lost": self.sessions_lost, "num_violations": self.num_violations,
            "violations": self.violations, "canary_turns": dict(self.canary_turns),
            "final_turns": dict(self.final_turns), "log_records": dict(self.log),
        }


class _LogCounter(logging.Handler):
    def __init__(self, counts: Counter) -> None:
        super().__init__(logging.DEBUG)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] += 1
        if record.exc_info or "Traceback" in record.getMessage():
            self.counts["traceback"] += 1
        if record.name.startswith("realtime_ming") and " failed: " in record.getMessage():
            self.counts["failure"] += 1  # session.failures.log_failure: a handler raised


@contextlib.contextmanager
def capture_logs(counts: Counter) -> Iterator[None]:
    """Count the root logger's records (at INFO and above) into `counts` while inside."""
    handler, root = _LogCounter(counts), logging.getLogger()
    handler.setLevel(logging.INFO)
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level, logging.INFO) if old_level else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


class _Session:
    """One fuzzed connection: send a frame plus a probe, collect the frame's answers."""

    def __init__(self, url: str, dialect: Dialect, report: FuzzReport, validate: Validator | None) -> None:
        self.url, self.dialect, self.report, self.validate = url, dialect, report, validate
        self.ws: Any = None
        self.voice = "alloy"
        self._probes = 0

    async def open(self) -> None:
        headers = {"OpenAI-Beta": "realtime=v1"} if self.dialect is Dialect.BETA else {}
        self.ws = await connect(self.url, additional_headers=headers, max_size=None, open_timeout=30)
        created = await self._recv()
        self.voice = created["session"].get("voice") or created["session"]["audio"]["output"]["voice"]

    async def _recv(self) -> dict:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), _READ_TIMEOUT_S))
        self.report.server_frames += 1
        if self.validate is not None:
            try:
                self.validate(frame, self.dialect)
            except Exception as exc:  # noqa: BLE001 - pydantic or assertion: counted, not fatal
                self.report.invalid_server_frames += 1
                self.report.violation(f"invalid {frame.get('type')} frame: {str(exc)[:300]}")
        return frame

    async def exchange(self, data: str | bytes) -> list[dict]:
        """Send `data`, then a probe; the server frames in between (the probe's error excluded)."""
        self._probes += 1
        probe_id = f"probe{self._probes}"
        await self.ws.send(data)
        await self.ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": PROBE_ITEM_ID, "event_id": probe_id}))
        answers = []
        while True:
            frame = await self._recv()
            if frame.get("type") == "error" and frame["error"].get("event_id") == probe_id:
                return answers
            answers.append(frame)

    async def normal_turn(self) -> str:
        """A user text item and a text response; the response's final status."""
        with contextlib.suppress(Exception):
            await self.exchange(json.dumps({"type": "response.cancel"}))
        await self.exchange(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello, how are you?"}]}}))
        modalities = "output_modalities" if self.dialect is Dialect.GA else "modalities"
        limit = "max_output_tokens" if self.dialect is Dialect.GA else "max_response_output_tokens"
        await self.ws.send(json.dumps({"type": "response.create", "response": {modalities: ["text"], limit: 8}}))
        async with asyncio.timeout(_READ_TIMEOUT_S):
            while True:
                frame = await self._recv()
                if frame["type"] == "response.done":
                    return frame["response"]["status"]


def _judge(report: FuzzReport, frame: FuzzFrame, answers: list[dict]) -> None:
    errors = [a["error"] for a in answers if a["type"] == "error"]
    report.errors_by_code.update(e.get("code") for e in errors)
    shown = repr(frame.data[:160]) if isinstance(frame.data, str) else f"<{len(frame.data)} binary bytes>"
    codes = [e.get("code") for e in errors]
    if "server_error" in codes:
        report.violation(f"{frame.kind}: server_error for {shown}")
    if not frame.invalid:
        if len(errors) > 1:
            report.violation(f"{frame.kind}: {len(errors)} errors {codes} for {shown}")
        return
    if len(errors) != 1:
        report.violation(f"{frame.kind}: {len(errors)} errors {codes} (want 1 of {sorted(frame.codes)}) for {shown}")
        return
    error = errors[0]
    if error.get("code") not in frame.codes:
        report.violation(f"{frame.kind}: code {error.get('code')} (want {sorted(frame.codes)}) for {shown}")
    elif frame.param is not ANY and error.get("param") != frame.param:
        report.violation(f"{frame.kind}: param {error.get('param')!r} (want {frame.param!r}) for {shown}")
    elif frame.event_id is not ANY and error.get("event_id") != frame.event_id:
        report.violation(f"{frame.kind}: event_id {error.get('event_id')!r} (want {frame.event_id!r})")


async def _fuzz_one(
    url: str, dialect: Dialect, num_frames: int, seed: int, max_frame_bytes: int, report: FuzzReport,
    validate: Validator | None,
) -> None:
    session = _Session(url, dialect, report, validate)
    await session.open()
    generator = FrameGenerator(seed, dialect, session.voice, max_frame_bytes)
    for _ in range(num_frames):
        frame = generator.next()
        report.frames += 1
        report.frames_by_kind[frame.kind] += 1
        try:
            _judge(report, frame, await session.exchange(frame.data))
        except (ConnectionClosed, TimeoutError) as exc:
            report.sessions_lost += 1
            report.violation(f"session lost after {frame.kind} frame {frame.data[:160]!r}: {exc!r}")
            await session.open()
    try:
        report.final_turns[await session.normal_turn()] += 1
    except (ConnectionClosed, TimeoutError) as exc:
        report.final_turns[type(exc).__name__] += 1
    await session.ws.close()


async def _canary(url: str, report: FuzzReport, validate: Validator | None, stop: asyncio.Event) -> None:
    """Normal turns on a session of its own, one after another, until `stop`."""
    session = _Session(url, Dialect.GA, report, validate)
    await session.open()
    while not stop.is_set():
        try:
            report.canary_turns[await session.normal_turn()] += 1
        except (ConnectionClosed, TimeoutError) as exc:
            report.canary_turns[type(exc).__name__] += 1
            await session.open()
        await asyncio.sleep(0.2)
    await session.ws.close()


async def run_fuzz(
    url: str, *, frames: int, sessions: int = 4, beta_sessions: int = 1, seed: int = 0,
    max_frame_bytes: int, validate: Validator | None = None,
) -> FuzzReport:
    """Fuzz the server at `url` with `frames` frames over `sessions` parallel sessions
    (`beta_sessions` of them beta) while a canary session runs normal turns."""
    report = FuzzReport()
    started = time.monotonic()
    stop = asyncio.Event()
    canary = asyncio.create_task(_canary(url, report, validate, stop))
    shares = [frames // sessions + (i < frames % sessions) for i in range(sessions)]
    dialects = [Dialect.BETA if i < beta_sessions else Dialect.GA for i in range(sessions)]
    try:
        await asyncio.gather(*(
            _fuzz_one(url, dialect, share, seed * 1000 + i, max_frame_bytes, report, validate)
            for i, (dialect, share) in enumerate(zip(dialects, shares, strict=True))
        ))
    finally:
        stop.set()
        await canary
    report.wall_s = time.monotonic() - started
    return report


@contextlib.asynccontextmanager
async def serve_tiny(max_frame_bytes: int):
    """Our server on loopback (ephemeral port) on the embedded tiny model, CPU; yields its URL."""
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.server import RealtimeServer, load_config

    engine = await asyncio.to_thread(Engine.create, EngineConfig())
    overrides = [
        "server.port=0", f"server.limits.max_frame_bytes={max_frame_bytes}",
        f"server.limits.max_message_bytes={4 * max_frame_bytes}",
    ]
    try:
        async with RealtimeServer(load_config(None, overrides), engine) as server:
            yield f"ws://127.0.0.1:{server.port}/v1/realtime?model=ming"
    finally:
        await asyncio.to_thread(engine.close)


def _repo_validator() -> Validator:
    """The test suite's check of server frames against the `openai` package (source checkout)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from server_support import validate_frame  # noqa: PLC0415 - tests/ is on the path only now

    return lambda frame, dialect: validate_frame(frame, dialect)


async def _main_async(args: argparse.Namespace) -> FuzzReport:
    validate = None if args.no_validate else _repo_validator()
    kwargs = dict(frames=args.frames, sessions=args.sessions, beta_sessions=args.beta_sessions, seed=args.seed,
                  max_frame_bytes=args.max_frame_bytes, validate=validate)
    if args.url:
        return await run_fuzz(args.url, **kwargs)
    counts: Counter = Counter()
    async with serve_tiny(args.max_frame_bytes) as url:
        with capture_logs(counts):
            report = await run_fuzz(url, **kwargs)
    report.log = counts
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=10_000, help="fuzz frames in all")
    parser.add_argument("--sessions", type=int, default=4, help="parallel fuzzed sessions")
    parser.add_argument("--beta-sessions", type=int, default=1, help="how many of them speak the beta dialect")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="fuzz this server instead of starting one (its log is not watched)")
    parser.add_argument("--max-frame-bytes", type=int, default=262_144,
                        help="the server's server.limits.max_frame_bytes (oversize frames exceed it)")
    parser.add_argument("--no-validate", action="store_true", help="skip the openai-types check of server frames")
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the run counts INFO records; print warnings only
        handler.setLevel(logging.WARNING)
    report = asyncio.run(_main_async(args))
    text = json.dumps(report.to_json(), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
