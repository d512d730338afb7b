"""A forced-reply engine that calls a tool, and a server on it, for the tool-call end-to-end tests."""

from __future__ import annotations

import pytest

from realtime_ming.server import RealtimeServer, load_config

ANSWER = "It is sunny in Paris."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FORCED = "Let me check. " + CALL + "<|role_end|>" + ANSWER + "<|role_end|>"


@pytest.fixture(scope="module")
def forced_engine():
    eng = _engine(forced_reply=FORCED)
    yield eng
    eng.close()


@pytest.fixture
async def server(forced_engine):
    async with RealtimeServer(load_config(None, ["server.port=0"]), forced_engine) as srv:
        yield srv


def _engine(**hooks):
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
    from realtime_ming.engine.hooks import EngineHooks

    return Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_seq_len=2048)), hooks=EngineHooks(**hooks))
