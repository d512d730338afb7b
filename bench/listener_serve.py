"""The listener bench's processes: the server under test started in a child (forced to tell a story, optionally
tracing its sends), and the measuring client's own CPU priority."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading


def serve_story(args: str, forced_reply: str, trace: str | None = None) -> tuple[subprocess.Popen, str]:
    """`realtime-ming serve ARGS` on a free port (no ARGS: the embedded tiny model), forced to tell a story; `trace`:
    its audio deltas' send times go there (`bench.send_trace`)."""
    entry = ["-m", "realtime_ming.cli"] if trace is None else ["-m", "bench.send_trace", trace]
    proc = subprocess.Popen([sys.executable, *entry, "serve", *shlex.split(args), "--port", "0",
                             "--hook", f"forced_reply={forced_reply}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r" on (wss?://\S+/v1/realtime)\s*$", line)
        if found:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
            return proc, found.group(1)
    raise RuntimeError(f"the tiny server exited ({proc.wait()})")


def client_priority(nice: int) -> int | None:
    """Run this process (the client: microphone, receipt times, playback model) at niceness `nice`; returns the
    niceness it got (None: not permitted, it runs as it was). With the server on the same few loaded cores, a client
    at the server's priority is starved by the server under test and other jobs: its microphone frames go out late
    and its receipt times are taken late, so it measures its own lateness as the server's. A client on its own device
    has neither; the server keeps the priority it was started with (the child is started before this)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (PermissionError, OSError) as exc:
        print(f"the client runs at its niceness ({os.getpriority(os.PRIO_PROCESS, 0)}): {exc}", file=sys.stderr)
        return None
    return os.getpriority(os.PRIO_PROCESS, 0)
