"""openai-agents' `RealtimeRunner` (unmodified) against the real server (embedded tiny model, CPU): it
names its own model (`gpt-realtime`) and turns tracing on by default (`tracing: "auto"`). The session
keeps working, reports the served model, and traces each response (README "Protocol support")."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("agents.realtime")

from agents.realtime import RealtimeAgent, RealtimeRunner

from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(240)]


async def test_openai_agents_session_reports_served_model_and_is_traced(engine, caplog):
    caplog.set_level(logging.INFO, logger="realtime_ming.tracing")
    config = load_config(None, ["server.port=0", "session.max_output_tokens=8"])
    async with RealtimeServer(config, engine) as srv:
        served = srv.model_id  # what /v1/models advertises
        runner = RealtimeRunner(RealtimeAgent(name="helper", instructions="Be brief."),
                                config={"model_settings": {"model_name": "gpt-realtime", "modalities": ["text"]}})
        session = await runner.run(model_config={
            "url": f"ws://127.0.0.1:{srv.port}/v1/realtime?model=gpt-realtime", "api_key": "x"})
        raw: list = []
        async with session:
            await session.send_message("Hello")
            async with asyncio.timeout(180):
                async for event in session:
                    if event.type == "raw_model_event" and getattr(event.data, "type", "") == "raw_server_event":
                        raw.append(event.data.data)
                    assert event.type != "error", event
                    if event.type == "agent_end":
                        break
    sessions = [e["session"] for e in raw if e.get("type") in ("session.created", "session.updated")]
    assert served != "gpt-realtime" and sessions and all(s["model"] == served for s in sessions)
    assert sessions[-1]["tracing"] == "auto"
    assert not [e for e in raw if e.get("type") == "error"]
    done = [e["response"]["id"] for e in raw if e.get("type") == "response.done"]
    traces = [r.trace for r in caplog.records if r.name == "realtime_ming.tracing"]
    assert done and [t["response_id"] for t in traces] == done
    assert all(t["workflow_name"] == "Realtime Session" for t in traces)
