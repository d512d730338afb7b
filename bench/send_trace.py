"""`python3 -m bench.send_trace FILE serve ARGS...`: `realtime-ming serve ARGS` that also writes, per audio delta, when
the session sent it by its playback clock and when the WebSocket writer handed it to the socket (bench only).

The listener bench (`bench.barge_in --listener --trace-sends`) joins these with its own receipt times to tell where a
client's drift behind the server's playback clock comes from: the server's send side (a delta stamped at `now`
but written later) or the receive side (written on time, read late). Monotonic clock, shared by the processes of one
machine. One JSON line per event:

* `{"clock": T, "rid": ID, "ms": MS}`: `PlaybackClock.sent` — the session counted MS of audio as sent at T;
* `{"wrote": T0, "done": T1, "rid": ID}`: the writer began / finished `send` of a `response.output_audio.delta`;
* `{"hold": T, "rid": ID}`: the output hold of response ID began (a guarded speech candidate; T when it was decided).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time

from realtime_ming import cli
from realtime_ming.server import connection
from realtime_ming.session import barge_in, playback

_RID = re.compile(r'"response_id"\s*:\s*"([^"]+)"')


def install(path: str) -> None:
    """Patch the playback clock and the connection writer of this process to log into `path`."""
    out = open(path, "a", buffering=1)
    lock = threading.Lock()

    def log(record: dict) -> None:
        with lock:
            out.write(json.dumps(record) + "\n")

    clock_sent = playback.PlaybackClock.sent

    def sent(self, ms: float, now: float) -> None:
        if ms > 0:
            log({"clock": now, "rid": self.response_id, "ms": ms})
        clock_sent(self, ms, now)

    playback.PlaybackClock.sent = sent

    gate_sync = barge_in.OutputGate.sync

    def sync(self, candidate: bool, turn_id: str | None, now: float, *args, **kwargs) -> bool:
        holding = self.turn_id
        ended = gate_sync(self, candidate, turn_id, now, *args, **kwargs)
        if self.turn_id is not None and self.turn_id != holding:
            log({"hold": time.monotonic(), "rid": self.turn_id})
        return ended

    barge_in.OutputGate.sync = sync

    class Traced:
        """The writer's transport, timing each delta's send."""

        def __init__(self, ws) -> None:
            self._ws = ws

        def __getattr__(self, name):
            return getattr(self._ws, name)

        async def send(self, frame) -> None:
            if isinstance(frame, str) and '"response.output_audio.delta"' in frame[:200]:
                t0 = time.monotonic()
                await self._ws.send(frame)
                found = _RID.search(frame)
                log({"wrote": t0, "done": time.monotonic(), "rid": found.group(1) if found else None})
                return
            await self._ws.send(frame)

    write = connection._write

    async def traced_write(ws, outbound, limits) -> None:
        await write(Traced(ws), outbound, limits)

    connection._write = traced_write


if __name__ == "__main__":
    install(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
