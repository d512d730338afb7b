"""Ending a process whose work is done, without interpreter finalization."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush logs and stdio, then `os._exit(code)`.

    For a process that has already shut its work down cleanly (the server, or a front-end process, once its
    sessions drained and the engine closed; a tensor-parallel worker once it left its process group; a talker
    process once it stopped), whose exit code is what its parent or supervisor reads. Interpreter finalization
    would tear down native threads (torch's thread pools and distributed teardown, onnxruntime) under threads
    still parked in them, which now and then aborts a clean exit with SIGABRT ("terminate called without an
    active exception") instead of exiting with `code`; the OS frees everything such a process holds.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced: nothing left to flush
            pass
    os._exit(code)
