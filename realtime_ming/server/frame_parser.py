"""Client frames parsed where their cost cannot stall the event loop.

A frame up to `INLINE_CHARS` is parsed on the event loop (a few milliseconds at most). A larger one is parsed
in a child process: decoding and checking megabytes of JSON holds the GIL for tenths of a second (128 tools at
every per-tool limit, ~9 MB, take ~0.1 s; a frame of millions of small values seconds), which on a worker thread
still stalls every session's events and /health, while in another process it costs this one only the copy of
the text there and of the event back (a frame received beside websockets, `big_frames.BigText`, is sent from
its buffer as it came, never decoded in this process). The text goes as raw UTF-8 bytes over a pipe (written in
pieces by a thread of the parser's own, which lets go of the GIL for each), not pickled: pickling a 9 MB string
held the GIL ~20 ms at once, a stall of every session per large frame. What comes back is small or cheap to rebuild: an
error, or an event of a type that carries media (a few large strings), since every other event type is refused
in the child right after decoding when its frame is over `server.limits.max_control_frame_bytes` (`codec.parse`).

A frame over the control cap that opens with the `type` of an event carrying no media (`{"type":"session.update",`
as every client library writes it) is refused right here from its first characters
(`codec.refuse_by_leading_type`), without being copied to the child nor decoded: the same error the child would
answer, at no cost to either process (issue 43: these refusals were half of what the tools attack cost a server).
A `response.create` over the cap without media (`media_scan`) is refused the same way: by the connection as it
arrives (`big_frames`), else in the child (from its text when it opens with its type, else right after decoding).

One child per server process (each front end its own, `spawn`: the engine's threads are never forked; at the lowest
CPU priority, so that on a busy host the event loop gets the core first), started by
`start` off the event loop when the server starts (starting it takes the starting thread ~0.1 s of the GIL, which
on the first large frame stalled every session for that long); a child that dies is replaced, on the parser's
thread, at the next large frame, and the frame it was parsing gets `server_error`, which ends nothing but that
frame. The child ends when the pipe closes: `close`, or this process's exit or death.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from ..protocol.codec import parse, refuse_by_leading_type
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent
from .big_frames import BigFrameLimits, BigText
from .config import LimitsConfig

__all__ = ["INLINE_CHARS", "FrameParser", "big_frame_limits", "limits_parser", "shared_parser"]

log = logging.getLogger(__name__)

# Frames above this many characters go to the child. An audio append of one second of 24 kHz PCM16 is 64,000
# characters of base64, so ordinary appends (tens of milliseconds each) stay inline.
INLINE_CHARS = 64 * 1024
_STOP_TIMEOUT_S = 2.0
# The child's CPU priority (nice): its work is one client's large frame, the event loop's every session and /health;
# on a busy host the loop gets the core first (issue 43, tools attack: /health p99 1.44-2.30 x -> 1.49-1.52 x baseline).
_CHILD_NICENESS = 19


def _child_main(conn: Connection, control_max_bytes: int) -> None:
    """The child: parse each (dialect, UTF-8 frame) it is sent, answer the event or error (or the failure of a bug
    in `parse`, as text); end when the parent closes the pipe (or dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle, not this helper's
    try:
        os.nice(_CHILD_NICENESS)
    except OSError:  # not permitted here: the child parses at the server's priority
        pass
    while True:
        try:
            dialect = conn.recv()
            frame = conn.recv_bytes().decode("utf-8", "surrogatepass")
        except (EOFError, OSError):
            return
        try:
            answer: object = parse(frame, dialect, control_max_bytes=control_max_bytes)
        except Exception as exc:  # noqa: BLE001 -- reported to the parent, which logs it as the frame's failure
            answer = _Failed(f"{type(exc).__name__}: {exc}")
        conn.send(answer)


class _Failed(str):
    """A bug in `parse` inside the child, as text."""


class _Child:
    """One parser process and the pipe to it, one frame at a time."""

    def __init__(self, control_max_bytes: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # the engine's threads are never forked
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_child_main, args=(theirs, control_max_bytes), daemon=True,
                                   name="realtime-ming-frame-parser")
        self.process.start()
        theirs.close()

    def parse(self, frame: str | BigText, dialect: Dialect) -> object:
        self.conn.send(dialect)
        if isinstance(frame, BigText):
            assert frame.data is not None
            self.conn.send_bytes(frame.data)  # already UTF-8: sent from its buffer as it is
        else:
            self.conn.send_bytes(frame.encode("utf-8", "surrogatepass"))
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.close()  # the child's next read ends, and so does it
        self.process.join(_STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_STOP_TIMEOUT_S)


class FrameParser:
    """`parse` with a frame-size policy: inline below `INLINE_CHARS`, in the child process above."""

    def __init__(self, control_max_bytes: int, inline_chars: int = INLINE_CHARS) -> None:
        self.control_max_bytes = control_max_bytes
        self.inline_chars = inline_chars
        self._child: _Child | None = None
        self._lock = threading.Lock()  # several event loops (tests, front ends' threads) may share one parser
        # the one thread that talks to the child (one frame at a time: the child parses one at a time)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="frame-parser")

    @property
    def running(self) -> bool:
        """Whether the child has been started (and not stopped by `close` or its death)."""
        return self._child is not None

    def start(self) -> None:
        """Start the child now unless it runs (blocking: call it off the event loop); it stays until `close`."""
        with self._lock:
            if self._child is None:
                self._child = _Child(self.control_max_bytes)

    async def parse(self, frame: str | bytes | BigText, dialect: Dialect) -> ClientEvent | ProtocolError:
        """The client event (or the error to answer) of one frame: a text frame (`str`), a binary one (refused), or
        a large text frame received beside websockets (`big_frames.BigText`: its refusal, or its bytes to the
        child as they are)."""
        if isinstance(frame, BigText):
            if frame.refused is not None:
                return frame.refused
        elif len(frame) <= self.inline_chars or not isinstance(frame, str):  # a binary frame is refused at once
            return parse(frame, dialect, control_max_bytes=self.control_max_bytes)
        elif (refused := refuse_by_leading_type(frame, self.control_max_bytes)) is not None:
            return refused
        answer = await asyncio.get_running_loop().run_in_executor(self._io, self._in_child, frame, dialect)
        if isinstance(answer, _Failed):
            raise RuntimeError(f"frame parser: {answer}")
        assert isinstance(answer, ClientEvent | ProtocolError)
        return answer

    def _in_child(self, frame: str | BigText, dialect: Dialect) -> object:
        """(On the parser's thread.) The child's answer; a child that is not running is started first (off the
        loop: the first large frame of a parser without `start`, or after a death)."""
        self.start()
        child = self._child
        assert child is not None
        try:
            return child.parse(frame, dialect)
        except (EOFError, OSError):
            log.warning("the frame parser process died; a new one starts at the next large frame")
            with self._lock:
                if self._child is child:
                    self._child = None
            child.stop()
            return ProtocolError(ErrorCode.SERVER_ERROR)

    def close(self) -> None:
        """Stop the child (if one was started); a later large frame starts another."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.stop()


_SHARED: dict[int, FrameParser] = {}
_SHARED_LOCK = threading.Lock()


def shared_parser(control_max_bytes: int) -> FrameParser:
    """The process's parser for one control-frame cap (one child process per server process)."""
    with _SHARED_LOCK:
        parser = _SHARED.get(control_max_bytes)
        if parser is None:
            parser = _SHARED[control_max_bytes] = FrameParser(control_max_bytes)
        return parser


def limits_parser(limits: LimitsConfig) -> FrameParser:
    """The process's parser for a server's limits (the control-frame cap, or the frame cap when it is smaller)."""
    return shared_parser(min(limits.max_control_frame_bytes, limits.max_frame_bytes))


def big_frame_limits(limits: LimitsConfig) -> BigFrameLimits:
    """What a server's connections receive beside websockets (server/big_frames.py): the text frames this process's
    parser would send to its child, refused by the parser's control cap and by `max_frame_bytes`."""
    parser = limits_parser(limits)
    return BigFrameLimits(threshold=parser.inline_chars, control_max_bytes=parser.control_max_bytes,
                          max_frame_bytes=limits.max_frame_bytes)
