"""Client frames parsed where their cost cannot stall the event loop.

A frame up to `INLINE_CHARS` is parsed on the event loop (a few milliseconds at most). A larger one is parsed
in a child process: decoding and checking megabytes of JSON holds the GIL for tenths of a second (128 tools at
every per-tool limit, ~9 MB, take ~0.1 s; a frame of millions of small values seconds), which on a worker thread
still stalls every session's events and /health, while in another process it costs the loop only the copy of
the text there and of the event back. What comes back is small or cheap to rebuild: an error, or an event of a
type that carries media (a few large strings), since every other event type is refused in the child right after
decoding when its frame is over `server.limits.max_control_frame_bytes` (`codec.parse`).

A frame over the control cap that opens with the `type` of an event carrying no media (`{"type":"session.update",`
as every client library writes it) is refused right here from its first characters
(`codec.refuse_by_leading_type`), without being copied to the child nor decoded: the same error the child would
answer, at no cost to either process (issue 43: these refusals were half of what the tools attack cost a server).

One child per server process (each front end its own, `spawn`: the engine's threads are never forked), started by
`start` off the event loop when the server starts (starting it takes the starting thread ~0.1 s of the GIL, which
on the first large frame stalled every session for that long); a child that dies is replaced at the next large
frame, and the frame it was parsing gets `server_error`, which ends nothing but that frame.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..protocol.codec import parse, refuse_by_leading_type
from ..protocol.dialect import Dialect
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.events import ClientEvent
from .config import LimitsConfig

__all__ = ["INLINE_CHARS", "FrameParser", "limits_parser", "shared_parser"]

log = logging.getLogger(__name__)

# Frames above this many characters go to the child. An audio append of one second of 24 kHz PCM16 is 64,000
# characters of base64, so ordinary appends (tens of milliseconds each) stay inline.
INLINE_CHARS = 64 * 1024


class FrameParser:
    """`parse` with a frame-size policy: inline below `INLINE_CHARS`, in the child process above."""

    def __init__(self, control_max_bytes: int, inline_chars: int = INLINE_CHARS) -> None:
        self.control_max_bytes = control_max_bytes
        self.inline_chars = inline_chars
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # several event loops (tests, front ends' threads) may share one parser

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    def _drop(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    @property
    def running(self) -> bool:
        """Whether the child has been started (and not stopped by `close` or its death)."""
        return self._pool is not None

    def start(self) -> None:
        """Start the child now (blocking: call it off the event loop); it stays until `close`."""
        self._executor().submit(os.getpid).result()

    async def parse(self, frame: str | bytes, dialect: Dialect) -> ClientEvent | ProtocolError:
        """The client event (or the error to answer) of one frame."""
        if len(frame) <= self.inline_chars or not isinstance(frame, str):  # a binary frame is refused at once
            return parse(frame, dialect, control_max_bytes=self.control_max_bytes)
        if (refused := refuse_by_leading_type(frame, self.control_max_bytes)) is not None:
            return refused
        if self._pool is None:  # the first large frame without `start`, or a replacement: started off the loop
            await asyncio.to_thread(self.start)
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(parse, frame, dialect, control_max_bytes=self.control_max_bytes))
        except BrokenProcessPool:
            log.warning("the frame parser process died; a new one starts at the next large frame")
            self._drop(pool)
            return ProtocolError(ErrorCode.SERVER_ERROR)

    def close(self) -> None:
        """Stop the child (if one was started); a later large frame starts another."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


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
