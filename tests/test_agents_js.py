"""The OpenAI Agents JS SDK's RealtimeSession over WebRTC, in headless Chromium, against this server.

`@openai/agents-realtime` (npm, bundled by agents_js_support) runs a `RealtimeAgent` with a function tool on its
WebRTC transport, `baseUrl` pointed at `/v1/realtime/calls`, with an ephemeral key minted by the real API key.
Chromium's fake microphone speaks (espeak-ng); the real engine (embedded tiny model, CPU) plays a forced reply:
the first turn calls the tool, the SDK runs it and asks for the answer, a long spoken one, which the looping
microphone then talks over. Every data-channel message the SDK received is validated against the openai
package's GA server-event union.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from agents_js_support import agents_bundle
from browser_support import MIC_RATE_HZ, _mic_file, _page, _wait_for
from conftest import tiny_engine_fixture
from realtime_validate import validate_server_event
from server_support import espeak, seconds

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

API_KEY = "sk-agents-js-test"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris, with a light wind from the west. " * 4
FORCED = "Let me check. " + CALL + "<|role_end|>" + ANSWER + "<|role_end|>"

engine = tiny_engine_fixture(forced_reply=FORCED, max_seq_len=4096)

SESSION_SCRIPT = """async ([secret, callsUrl]) => {
  const { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool, z } = window.AgentsRealtime;
  const log = window.__agents = { frames: [], calls: [], errors: [], stoppedAt: 0, heardFrom: {} };
  const getWeather = tool({
    name: "get_weather", description: "The weather of a city.", parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => { log.calls.push(city); return `It is sunny in ${city}.`; },
  });
  const agent = new RealtimeAgent({ name: "Assistant", instructions: "Answer briefly.", tools: [getWeather] });
  let transport;
  transport = new OpenAIRealtimeWebRTC({
    baseUrl: callsUrl,
    changePeerConnection: async (pc) => {  // every message as the server sent it, from the first one
      transport.connectionState.dataChannel.addEventListener("message", (m) => {
        log.frames.push(m.data);
        const ev = JSON.parse(m.data);
        if (ev.type === "input_audio_buffer.speech_stopped" && !log.stoppedAt) {
          log.stoppedAt = performance.now();
          window.__session.mute(true);  // one spoken turn; the test unmutes to interrupt
        }
        if (ev.type === "output_audio_buffer.started") log.heardFrom[ev.response_id] = performance.now();
      });
      return pc;
    },
  });
  const session = new RealtimeSession(agent, { transport, model: "ming" });
  window.__session = session;
  session.on("error", (e) => log.errors.push(String(e?.error?.error?.message ?? e?.error?.message ?? e?.error ?? e)));
  await session.connect({ apiKey: secret });
  return transport.callId;
}"""

HISTORY = """() => window.__session.history.map((item) => ({ type: item.type, role: item.role, name: item.name,
    status: item.status, output: item.output, arguments: item.arguments }))"""


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("What is the weather in Paris today?", tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


async def test_agents_js_realtime_session_over_webrtc(engine, speech, tmp_path):
    bundle = agents_bundle()
    mic = _mic_file(tmp_path, speech, gap_s=3.0)
    config = load_config(None, ["server.port=0", f"server.auth.api_keys=[{API_KEY}]"])
    async with RealtimeServer(config, engine) as srv, _page(mic) as page:
        base = f"http://127.0.0.1:{srv.port}"
        async with httpx.AsyncClient(timeout=seconds(30)) as http:  # the app's backend mints for its page
            minted = await http.post(f"{base}/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {API_KEY}"},
                                     json={"session": {"type": "realtime", "model": "ming"}})
        assert minted.status_code == 200, minted.text
        secret = minted.json()["value"]
        await page.goto(f"{base}/?transport=websocket")  # any page of the server's origin
        await page.add_script_tag(path=str(bundle))
        call_id = await page.evaluate(SESSION_SCRIPT, [secret, f"{base}/v1/realtime/calls"])
        # a spoken turn → the tool call → the SDK runs it and asks for the answer, which plays for a while
        await _wait_for(page, "() => window.__agents.calls.length > 0", 180)
        await _wait_for(page, """() => { const started = Object.entries(window.__agents.heardFrom);
                 return started.length >= 2 && performance.now() - started[started.length - 1][1] > 1500; }""", 180)
        await page.evaluate("window.__session.mute(false)")  # the looping microphone talks over the answer
        await _wait_for(page, """() => window.__agents.frames.some(f => f.includes('"output_audio_buffer.cleared"'))
                 && window.__agents.frames.some(f => f.includes('"conversation.item.truncated"'))""", 120)
        await page.wait_for_timeout(500)  # the SDK's retrieve after the truncation
        log = await page.evaluate("window.__agents")
        history = await page.evaluate(HISTORY)
    events = [json.loads(frame) for frame in log["frames"]]
    for event in events:
        validate_server_event(event, Dialect.GA, allow_playout=True)
    types = [e["type"] for e in events]
    assert call_id and call_id.startswith("rtc_")
    assert log["errors"] == [] and page.errors == []
    assert "response.output_audio.delta" not in types
    # the spoken turn and the function tool
    assert types.index("input_audio_buffer.speech_started") < types.index("response.function_call_arguments.done")
    assert log["calls"][0] == "Paris"
    outputs = [e for e in events if e["type"] == "conversation.item.added"
               and e["item"]["type"] == "function_call_output"]
    assert outputs and outputs[0]["item"]["output"] == "It is sunny in Paris."
    calls = [item for item in history if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and calls[0]["status"] == "completed"
    # the interruption: speech over the heard answer clears the playout and truncates it to what was played
    cleared = next(e for e in events if e["type"] == "output_audio_buffer.cleared")
    answer_started = next(e for e in events if e["type"] == "output_audio_buffer.started"
                          and e["response_id"] == cleared["response_id"])
    assert types.index("input_audio_buffer.speech_started", events.index(answer_started)) < events.index(cleared)
    truncated = next(e for e in events[events.index(cleared):] if e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] >= 1000
    assert any(e["type"] == "conversation.item.retrieved" and e["item"]["id"] == truncated["item_id"] for e in events)
