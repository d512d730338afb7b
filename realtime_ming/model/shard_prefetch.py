"""Reading checkpoint shards ahead of the loader: the page cache warmed by parallel sequential reads.

`loader.load_weights` reads each shard through safetensors' memory map, tensor by tensor, in file order: on a
cold cache that is one page fault (one small read) at a time, far below what a disk serves to many parallel
large reads. `ShardPrefetch` reads the shard being loaded and the next `depth` ones with `readers` threads, each
taking 16 MiB ranges in turn (the GIL is released while the disk works), into the page cache only: the bytes are
dropped at once, so the process's memory does not grow (the kernel's clean cache pages are reclaimable), and the
loader's own reads of those files then come from memory. The files are read at most once each; `close` stops.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["ShardPrefetch"]

CHUNK = 16 << 20


class ShardPrefetch:
    """Warm the page cache with files `paths[i .. i + depth]` while the loader is at file i (`at(i)`)."""

    def __init__(self, paths: list[Path], *, depth: int = 2, readers: int = 8):
        self.paths, self.depth = list(paths), depth
        self._next = 0  # the first file not yet scheduled
        self._stop = threading.Event()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(readers, thread_name_prefix="shard-prefetch") if readers > 0 else None

    def at(self, index: int) -> None:
        """The loader starts on file `index`: schedule every file up to index + depth not yet scheduled."""
        if self._pool is None:
            return
        while self._next < len(self.paths) and self._next <= index + self.depth:
            path = self.paths[self._next]
            try:
                size = path.stat().st_size
            except OSError:  # the loader reports a missing file itself
                size = 0
            for offset in range(0, size, CHUNK):
                self._pool.submit(self._read, path, offset)
            self._next += 1

    def _read(self, path: Path, offset: int) -> None:
        if self._stop.is_set():
            return
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(CHUNK)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.preadv(fd, [buf], offset)
        except OSError:
            pass
        finally:
            os.close(fd)

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ShardPrefetch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
