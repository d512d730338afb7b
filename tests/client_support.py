"""What the real-client tests (pipecat, LiveKit) share: the forced reply with a Ming tool call, the engine that
plays it, and the server behind a frame-validating tap; the test modules import the `engine` (one per module)
and `tap` fixtures from here."""

from __future__ import annotations

import contextlib

import pytest
from frame_tap import FrameTap

from realtime_ming.server import RealtimeServer, load_config

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris."
FORCED = "Let me check. " + CALL + "<|role_end|>" + ANSWER + "<|role_end|>"
HEARD = "What is the weather in Paris?"
WIRE_HZ = 24000


def forced_tool_engine():
    """The tiny engine playing FORCED (a tool call, then the answer) and transcribing HEARD, with the engine's
    default context (4,096 tokens). A client's own messages are part of the prompt: pipecat's first response
    of its own sends its whole local context packed into one user message, 895 to 1,000+ tokens (tiny
    tokenizer) as its timers decide what that context holds by then; a 2,048-token context leaves 932 tokens
    for it (minus the reply's 512 and the 604-token system turn of the tool), so the turn failed
    `context_length_exceeded` whenever the host was slow enough for the user's transcript to be in it."""
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.hooks import EngineHooks

    return Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply=FORCED, forced_transcript=HEARD))


@contextlib.asynccontextmanager
async def tapped_server(engine):
    """Our server on `engine` behind a `FrameTap` (every server frame validated)."""
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv, FrameTap(srv.port) as tap:
        yield tap


@pytest.fixture(scope="module")
def engine():
    eng = forced_tool_engine()
    yield eng
    eng.close()


@pytest.fixture
async def tap(engine):
    async with tapped_server(engine) as tap:
        yield tap
