"""`served_cli`: `realtime-ming serve` (or another program) as a child process on loopback, for the tests of what
only a real process shows (start-up output, signals, exit codes, front-end processes, TLS, the installed wheel).

Nothing here is a test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.client import HTTPMessage
from pathlib import Path

from server_support import seconds

REPO = Path(__file__).resolve().parent.parent
CLI = (sys.executable, "-m", "realtime_ming.cli")
# `realtime-ming: serving <model> on ws://host:port/v1/realtime` (wss:// with TLS), printed once listening.
_SERVING_LINE = re.compile(r" on ((wss?)://(\S+):(\d+)/v1/realtime)\s*$")


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the checkout on PYTHONPATH (so the code under test runs), plus `extra`."""
    return {**os.environ, "PYTHONPATH": str(REPO), **(extra or {})}


class ServedCli:
    """A running `realtime-ming serve` child: its URL and port, its output, its exit code.

    A reader thread keeps the child's output (stdout and stderr, interleaved) drained and kept, so a
    chatty server never blocks on a full pipe and a failing test can show everything it said.
    """

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.url: str | None = None  # ws://127.0.0.1:PORT/v1/realtime (wss:// with TLS)
        self.port: int | None = None
        self.startup = ""  # the output up to and including the serving line
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._serving_or_gone = threading.Event()
        self._reader = threading.Thread(target=self._read, name="served-cli-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self._lines.append(line)
                match = _SERVING_LINE.search(line) if self.url is None else None
                if match:
                    self.url, self.port = match.group(1), int(match.group(4))
                    self.startup = "".join(self._lines)
                    self._serving_or_gone.set()
        self._serving_or_gone.set()

    @property
    def output(self) -> str:
        """Everything the child wrote so far."""
        with self._lock:
            return "".join(self._lines)

    def wait_serving(self, timeout: float) -> None:
        """Block until the serving line is printed; fail if the child exits first or `timeout` (scaled) passes."""
        if not self._serving_or_gone.wait(seconds(timeout)):
            raise AssertionError(f"the server printed no serving line within {seconds(timeout):.0f} s")
        if self.url is None:
            code = self.proc.wait(seconds(10))
            raise AssertionError(f"the server exited with code {code} before serving")

    def get(self, path: str, *, context=None) -> tuple[int, HTTPMessage, bytes]:
        """GET `path` over HTTP(S) on the server's port → (status, headers, body); non-2xx raises HTTPError."""
        base = re.sub(r"^ws", "http", self.url).removesuffix("/v1/realtime")
        with urllib.request.urlopen(base + path, timeout=seconds(10), context=context) as reply:
            return reply.status, reply.headers, reply.read()

    def health(self, *, context=None) -> dict:
        """The JSON of GET /health (which must answer 200)."""
        status, _, body = self.get("/health", context=context)
        assert status == 200, body
        return json.loads(body)

    def wait_exit(self, timeout: float) -> int:
        """The child's exit code; fail if it is still running after `timeout` (scaled) seconds."""
        try:
            return self.proc.wait(timeout=seconds(timeout))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server was still running {seconds(timeout):.0f} s later") from None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        """Send `sig` and return the exit code (within `timeout` scaled seconds)."""
        self.proc.send_signal(sig)
        return self.wait_exit(timeout)

    def _reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(seconds(10))


@contextmanager
def served_cli(*args: str, program: Sequence[str] = CLI, env: Mapping[str, str] | None = None,
               cwd: Path = REPO, start_timeout: float = 120.0) -> Iterator[ServedCli]:
    """Run `<program> serve --port 0 --log-level WARNING *args` and yield it once it prints its URL.

    `program` defaults to this interpreter's `-m realtime_ming.cli`; `env` to `cli_env()`. The start
    is bounded by `start_timeout` (scaled). On leaving, the child is killed if still running; when
    anything inside fails, the exception carries the child's whole output as a note.
    """
    command = [*program, "serve", "--port", "0", "--log-level", "WARNING", *args]
    proc = subprocess.Popen(command, cwd=cwd, env=dict(cli_env() if env is None else env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = ServedCli(proc)
    try:
        server.wait_serving(start_timeout)
        yield server
    except Exception as exc:
        server._reap()
        exc.add_note(f"---- output of `{shlex.join(command)}` (exit code {proc.returncode}) ----\n{server.output}")
        raise
    finally:
        server._reap()
        proc.stdout.close()
