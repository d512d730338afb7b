"""Mapped buffers for the large client frames `big_frames` receives, kept for the next large frame.

A large frame is received into one anonymous `mmap` of its length. Its pages appear as they are first written: the
kernel faults in and zeroes each 4 KiB page, ~2,300 faults for a 9.4 MB frame, measured as half of what receiving
such a frame costs the event loop (issue 43's tools attack: 10 ms of a 22 ms receive; writing into pages already
mapped, 1.3 ms). A frame that is refused (over a cap, without media, not UTF-8) never leaves the connection, so its
buffer comes back here and the next large frame reuses it, pages already mapped. A frame that is delivered keeps its
buffer (the frame parser sends from it); that buffer is freed when the parse is done, as before.

At most `max_bytes` are kept across the process (every connection, every front end's loop: a lock). The smallest
free buffer that fits is reused; only the first `length` bytes of a buffer are ever written, read or delivered, so
what an earlier frame left beyond them is never seen.
"""

from __future__ import annotations

import mmap
import threading

__all__ = ["FrameBuffers", "frame_buffers"]

# Two frames at the largest size the shipped limits let through to the tracker (16 MiB): ~32 MiB resident at most.
_MAX_KEPT_BYTES = 32 << 20


class FrameBuffers:
    """Free frame buffers: `take` one for a frame of `length` bytes, `give` back one whose frame was dropped."""

    def __init__(self, max_bytes: int = _MAX_KEPT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[mmap.mmap] = []
        self._kept = 0
        self._lock = threading.Lock()
        self.reused = 0  # buffers handed out again (tests, diagnostics)

    @property
    def kept_bytes(self) -> int:
        return self._kept

    def take(self, length: int) -> mmap.mmap:
        """A buffer of at least `length` bytes: the smallest free one that fits, else a new one of `length`."""
        with self._lock:
            fits = [k for k, buf in enumerate(self._free) if len(buf) >= length]
            if fits:
                buf = self._free.pop(min(fits, key=lambda k: len(self._free[k])))
                self._kept -= len(buf)
                self.reused += 1
                return buf
        return mmap.mmap(-1, length)

    def give(self, buf: mmap.mmap) -> None:
        """Keep `buf` (nothing else may hold it) for a later frame while under `max_bytes`, larger ones first."""
        with self._lock:
            self._free.append(buf)
            self._kept += len(buf)
            self._free.sort(key=len, reverse=True)
            while self._kept > self.max_bytes:
                self._kept -= len(self._free.pop())  # the smallest goes (its pages are unmapped when it is freed)


_BUFFERS = FrameBuffers()


def frame_buffers() -> FrameBuffers:
    """The process's buffers (shared by every connection)."""
    return _BUFFERS
