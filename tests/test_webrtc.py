"""WebRTC calls end to end on loopback with an aiortc client (fast: the scripted StubEngine).

A call is an SDP offer posted to `/v1/realtime/calls` with an API key or an ephemeral key; the events travel on
the `oai-events` data channel (every one validated against the openai package's GA server-event union, the
WebRTC-only `output_audio_buffer.*` included) and the audio as Opus on the media tracks. What the client hears
on the track is checked against what the server says it played (`output_audio_buffer.*`, the truncation).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from rtc_support import MIC_RATE_HZ, RtcClient, mint
from server_support import espeak, seconds, stub_served
from websockets.asyncio.client import connect

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(180)]  # aiortc clients on loopback: the full tier

WORD_S = 1.0  # seconds of audio per scripted word
HEARD_PEAK = 1000  # a 20 ms frame of the stub's tone (amplitude 0.1) peaks far above this; Opus silence below


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    return espeak("Wait, stop, I have a question.", tmp_path_factory.mktemp("speech"), MIC_RATE_HZ)


def _heard_ms(client: RtcClient, since: float = 0.0, until: float = float("inf")) -> int:
    """Milliseconds of the server's track that carried the tone (20 ms frames above the peak) in [since, until)."""
    return 20 * sum(1 for t, frame in client.audio if since <= t < until and np.abs(frame).max() > HEARD_PEAK)


def _user_text(client: RtcClient, text: str) -> None:
    client.send(type="conversation.item.create",
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    client.send(type="response.create")


async def test_a_text_turn_plays_on_the_track_and_the_playout_says_so():
    """Minted config applies (session.created shows it), the reply's audio comes on the track, never as deltas on
    the data channel, and output_audio_buffer.started / .stopped frame it, stopped after response.done."""
    async with stub_served(words=("Hello", " there."), chunk_s=0.5) as srv:
        minted = await mint(srv.port, session={"type": "realtime", "instructions": "Be brief.",
                                               "audio": {"input": {"turn_detection": None}}})
        assert minted.status_code == 200
        client = RtcClient()
        reply = await client.connect(srv.port, minted.json()["value"])
        assert reply.headers["content-type"] == "application/sdp"
        assert reply.headers["location"] == f"/v1/realtime/calls/{client.call_id}"
        try:
            created = await client.wait_type("session.created")
            assert created["session"]["instructions"] == "Be brief."
            assert created["session"]["audio"]["input"]["turn_detection"] is None
            _user_text(client, "Hi")
            done = await client.wait_type("response.done")
            stopped = await client.wait_type("output_audio_buffer.stopped", response_id=done["response"]["id"])
            heard = _heard_ms(client)
        finally:
            await client.close()
    types = client.types()
    assert "response.output_audio.delta" not in types
    assert types.index("response.created") < types.index("output_audio_buffer.started") < types.index("response.done")
    assert types.index("response.done") < client.events.index(stopped)
    assert abs(heard - 1000) <= 100, heard  # 2 words x 0.5 s, every frame of it


async def _speak_over_reply(client: RtcClient, speech: np.ndarray, after_ms: int) -> dict:
    """Wait until `after_ms` of the reply was heard, then talk: returns output_audio_buffer.cleared."""
    started = await client.wait_type("output_audio_buffer.started")
    deadline = time.monotonic() + seconds(30)
    while _heard_ms(client) < after_ms:
        assert time.monotonic() < deadline, "the reply was not heard"
        await asyncio.sleep(0.02)
    client.mic.say(np.concatenate([speech, np.zeros(MIC_RATE_HZ, np.float32)]))
    return await client.wait_type("output_audio_buffer.cleared", response_id=started["response_id"])


@pytest.mark.parametrize("generating", [False, True], ids=["reply-fully-generated", "reply-still-generating"])
async def test_barge_in_clears_the_playout_and_truncates_to_what_was_heard(speech, generating):
    """Speech over a reply (generated already, or still generating at about real time): the server clears its
    playout (output_audio_buffer.cleared after speech_started), the track goes quiet, and the item is truncated
    to the milliseconds it played, which is what the client heard; a reply still in progress is cancelled."""
    step_s = 0.8 if generating else 0.001  # seconds per scripted word (its audio is WORD_S)
    async with stub_served(words=("One. ",) * 8, chunk_s=WORD_S, step_s=step_s) as srv:
        client = RtcClient()
        await client.connect(srv.port, None)
        try:
            await client.wait_type("session.created")
            _user_text(client, "Count for me.")
            cleared = await _speak_over_reply(client, speech, after_ms=1500)
            truncated = await client.wait_type("conversation.item.truncated")
            done = await client.wait_for(lambda e: e["type"] == "response.done"
                                         and e["response"]["id"] == cleared["response_id"])
            heard = _heard_ms(client)
            # the user's turn gets its own reply: what was heard between the clear and that reply's start
            following = await client.wait_for(lambda e: e["type"] == "output_audio_buffer.started"
                                              and e["response_id"] != cleared["response_id"])
            heard_after = _heard_ms(client, since=client.at(cleared) + 0.3, until=client.at(following))
        finally:
            await client.close()
    types = client.types()
    assert types.index("input_audio_buffer.speech_started") < client.events.index(cleared)
    assert client.events.index(cleared) < client.events.index(truncated)
    item = done["response"]["output"][0]
    assert truncated["item_id"] == item["id"] and truncated["content_index"] == 0
    assert 1500 <= truncated["audio_end_ms"] < 8 * WORD_S * 1000
    assert abs(heard - truncated["audio_end_ms"]) <= 250, (heard, truncated)
    assert heard_after == 0  # nothing of the cleared reply after the clear
    # generated or not, the session paces the reply to what is played (docs/barge_in.md): it is still in progress
    # when the user talks over it, and is cancelled
    assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == ("cancelled", "turn_detected")
    assert "output_audio_buffer.stopped" not in types[:client.events.index(cleared)]


async def test_client_clear_drops_the_rest_of_the_reply():
    """output_audio_buffer.clear (what the Agents SDK sends on interrupt): cleared, truncated, the rest unheard."""
    async with stub_served(words=("One. ",) * 6, chunk_s=WORD_S, step_s=0.001) as srv:
        client = RtcClient()
        await client.connect(srv.port, None)
        try:
            await client.wait_type("session.created")
            client.send(type="session.update", session={"type": "realtime",
                                                        "audio": {"input": {"turn_detection": None}}})
            await client.wait_type("session.updated")
            _user_text(client, "Count.")
            await client.wait_type("output_audio_buffer.started")
            while _heard_ms(client) < 500:
                await asyncio.sleep(0.02)
            client.send(type="output_audio_buffer.clear", event_id="evt_clear")
            cleared = await client.wait_type("output_audio_buffer.cleared")
            truncated = await client.wait_type("conversation.item.truncated")
            client.send(type="output_audio_buffer.clear")  # nothing plays: names the last response again
            again = await client.wait_for(lambda e: e["type"] == "output_audio_buffer.cleared" and e is not cleared)
        finally:
            await client.close()
    assert again["response_id"] == cleared["response_id"]
    assert 500 <= truncated["audio_end_ms"] < 6000
    assert not any(e["type"] == "error" for e in client.events)


async def test_ephemeral_key_is_single_use_scoped_and_revocable():
    """An ek opens one call and is spent; a revoked one opens none; an ek cannot mint; an API key server
    refuses a call without a key and takes one with it."""
    async with stub_served("server.auth.api_keys=[sk-real]") as srv:
        assert (await mint(srv.port)).status_code == 401
        assert (await mint(srv.port, "wrong")).status_code == 401
        first = (await mint(srv.port, "sk-real")).json()["value"]
        second = (await mint(srv.port, "sk-real")).json()["value"]
        client = RtcClient()
        await client.connect(srv.port, first)
        await client.wait_type("session.created")
        await client.close()
        for key, status in ((first, 401), (None, 401), ("wrong", 401)):
            again = RtcClient()
            reply = await again.connect(srv.port, key, expect_status=status)
            assert reply.json()["error"]["code"] == "invalid_api_key"
            await again.close()
        refused = await mint(srv.port, second)  # an ephemeral key cannot mint another
        assert refused.status_code == 401
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{srv.port}/v1/realtime/client_secrets/{second}"
            revoked = await http.delete(url, headers={"Authorization": "Bearer sk-real"})
            assert revoked.status_code == 200 and revoked.json()["deleted"] is True
            assert (await http.delete(url, headers={"Authorization": "Bearer sk-real"})).status_code == 404
        late = RtcClient()
        await late.connect(srv.port, second, expect_status=401)
        await late.close()
        real = RtcClient()
        await real.connect(srv.port, "sk-real")
        await real.wait_type("session.created")
        await real.close()


async def test_ephemeral_key_opens_a_websocket_session_with_its_config():
    """The same ek works as the WebSocket bearer (and as the browser subprotocol), once."""
    async with stub_served("server.auth.api_keys=[sk-real]") as srv:
        keys = [(await mint(srv.port, "sk-real", session={"type": "realtime", "instructions": f"Number {i}."}))
                .json()["value"] for i in range(2)]
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        async with connect(url, additional_headers={"Authorization": f"Bearer {keys[0]}"}) as ws:
            created = json.loads(await ws.recv())
        async with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{keys[1]}"]) as ws:
            created_browser = json.loads(await ws.recv())
        with pytest.raises(Exception, match="401"):
            async with connect(url, additional_headers={"Authorization": f"Bearer {keys[0]}"}):
                pass
    assert created["session"]["instructions"] == "Number 0."
    assert created_browser["session"]["instructions"] == "Number 1."


async def test_call_with_a_multipart_session_config_and_hangup():
    """openai SDK shape: multipart sdp + session; the session starts with it; the API hangs the call up."""
    async with stub_served() as srv:
        client = RtcClient()
        await client.connect(srv.port, None, session={"type": "realtime", "instructions": "From the form.",
                                                      "output_modalities": ["text"]})
        created = await client.wait_type("session.created")
        async with httpx.AsyncClient() as http:
            base = f"http://127.0.0.1:{srv.port}/v1/realtime/calls"
            hung = await http.post(f"{base}/{client.call_id}/hangup")
            missing = await http.post(f"{base}/rtc_nope/hangup")
        deadline = time.monotonic() + seconds(10)
        while srv.num_sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sessions_after = srv.num_sessions
        await client.close()
    assert created["session"]["instructions"] == "From the form."
    assert created["session"]["output_modalities"] == ["text"]
    assert (hung.status_code, missing.status_code) == (200, 404)
    assert sessions_after == 0


async def _post(port: int, body: bytes | str, content_type: str, path: str = "/v1/realtime/calls",
                headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=seconds(30)) as http:
        return await http.post(f"http://127.0.0.1:{port}{path}", content=body,
                               headers={"Content-Type": content_type, **(headers or {})})


async def test_bad_offers_and_configs_get_clear_errors():
    """Not SDP, no data channel, a bad session config, a wrong content type: 4xx with a code and a param; the
    server serves the next call."""
    async with stub_served() as srv:
        not_sdp = await _post(srv.port, "hello", "application/sdp")
        no_channel = await _post(srv.port, "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
                                 "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "application/sdp")
        wrong_type = await _post(srv.port, "{}", "application/json")
        client = RtcClient()
        bad_voice = await client.connect(srv.port, None, session={"audio": {"output": {"voice": "nope"}}},
                                         expect_status=400)
        await client.close()
        get = await httpx.AsyncClient().get(f"http://127.0.0.1:{srv.port}/v1/realtime/calls")
        good = RtcClient()
        await good.connect(srv.port, None)
        await good.wait_type("session.created")
        await good.close()
    assert (not_sdp.status_code, not_sdp.json()["error"]["code"]) == (400, "invalid_offer")
    assert "data channel" in no_channel.json()["error"]["message"]
    assert wrong_type.status_code == 415
    assert bad_voice.json()["error"]["param"] == "session.audio.output.voice"
    assert get.status_code == 405 and get.headers["allow"] == "POST"


async def test_cors_preflight_names_only_allowed_origins():
    async with stub_served("server.auth.allowed_origins=[https://app.example]") as srv:
        async with httpx.AsyncClient() as http:
            asked = {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
            base = f"http://127.0.0.1:{srv.port}/v1/realtime/calls"
            ok = await http.options(base, headers={"Origin": "https://app.example", **asked})
            other = await http.options(base, headers={"Origin": "https://evil.example", **asked})
    assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == "https://app.example"
    assert ok.headers["access-control-allow-headers"] == "authorization, content-type"
    assert "location" in ok.headers["access-control-expose-headers"].lower()
    assert "access-control-allow-origin" not in other.headers


async def test_a_call_counts_against_max_sessions():
    async with stub_served("server.limits.max_sessions=1") as srv:
        first = RtcClient()
        await first.connect(srv.port, None)
        await first.wait_type("session.created")
        second = RtcClient()
        busy = await second.connect(srv.port, None, expect_status=503)
        await first.close()
        await second.close()
    assert busy.json()["error"]["code"] == "session_limit_reached" and busy.headers["retry-after"] == "1"


async def test_websocket_sideband_join_of_a_call_is_refused_not_ignored():
    """`/v1/realtime?call_id=` (OpenAI's sideband control of a WebRTC call) is not offered: a 400 that says so,
    not an unrelated new session."""
    async with stub_served() as srv:
        with pytest.raises(Exception, match="400"):
            async with connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?call_id=rtc_123"):
                pass
