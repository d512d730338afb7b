"""Stand-in talker children for `ProcessTalker`'s bounded waits (spawned by reference: this module is imported in the
child through the parent's sys.path). Nothing here is a test."""

from __future__ import annotations

import time

from realtime_ming.engine.talker_child import Phase, Ready, Stop


def never_reads(spec, ops, out) -> None:
    """A child stuck before its first read (never takes its weights, never answers)."""
    time.sleep(600)


def never_captures(spec, ops, out) -> None:
    """A child that starts (reports a phase, then ready) and takes every op but never answers a capture."""
    ops.recv()  # the weights
    out.send(Phase("stand-in started", 0.5))
    out.send(Ready(None))
    while not isinstance(ops.recv(), Stop):
        pass


class Blob:
    """A talker or VAE whose state is one big pickled value: its message outgrows the pipe's buffer, so sending it
    waits for the child to read it."""

    def state_dict(self) -> dict:
        return {"blob": b"\0" * (4 << 20)}
