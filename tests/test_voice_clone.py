"""Voice cloning end to end on loopback (tiny engine, CPU): register over HTTP, speak in a session.

A voice registered from an espeak-ng clip is the one the talker is given in a later session's reply
(its speaker embedding and prompt latents, the very tensors the store holds, not the default voice's);
it is invisible to another API key; bad uploads, unknown ids and wrong keys get clear 4xx / `error`s;
the store is bounded (LRU eviction by count, per key and by bytes).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
import requests
import soundfile as sf
import torch
from server_support import WsClient, espeak
from websockets.asyncio.client import connect

from realtime_ming.engine.voice_store import CustomVoice, VoiceStore, VoiceStoreFull
from realtime_ming.model.talker import VoicePrompt
from realtime_ming.protocol import Dialect
from realtime_ming.protocol.session import DEFAULT_VOICE
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.session.voices import OPENAI_VOICE_ALIASES, SessionVoices

pytestmark = pytest.mark.timeout(120)

KEY_A, KEY_B = "key-a", "key-b"
TRANSCRIPT = "Hello there, this is my own voice."


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[np.ndarray, int]:
    """espeak-ng speech at 22.05 kHz (a rate the VAE does not use: the upload is resampled)."""
    return espeak(TRANSCRIPT, tmp_path_factory.mktemp("clip"), rate_hz=22050), 22050


def _wav(samples: np.ndarray, rate: int, subtype: str = "PCM_16", fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, subtype=subtype, format=fmt)
    return buf.getvalue()


class _FakeCampPlus:
    """Stand-in for campplus.onnx (absent from the tiny model): a 192-d vector that depends on the clip."""

    def __call__(self, fbank):
        feats = torch.as_tensor(fbank).float().reshape(-1, 80)
        return torch.cat([feats.mean(0), feats.std(0), feats.amax(0)])[:192][None]


@pytest.fixture
async def server(engine, monkeypatch):
    monkeypatch.setattr(engine.bundle.voice_encoder, "campplus", _FakeCampPlus())
    cfg = load_config(None, ["server.port=0", f"server.auth.api_keys=[{KEY_A}, {KEY_B}]",
                             "server.voices.max_duration_s=8", "server.voices.max_upload_bytes=1000000",
                             "server.voices.max_voices_per_key=2"])
    async with RealtimeServer(cfg, engine) as srv:
        yield srv


def _url(srv, suffix: str = "") -> str:
    return f"http://127.0.0.1:{srv.port}/v1/realtime/voices{suffix}"


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def _post(srv, key: str = KEY_A, **kwargs) -> requests.Response:
    return await asyncio.to_thread(requests.post, _url(srv), headers=_auth(key), timeout=30, **kwargs)


async def _register(srv, clip, key: str = KEY_A, name: str = "mine") -> dict:
    samples, rate = clip
    r = await _post(srv, key, files={"audio_sample": ("me.wav", _wav(samples, rate), "audio/wav")},
                    data={"transcript": TRANSCRIPT, "name": name})
    assert r.status_code == 200, r.text
    return r.json()


async def _session(srv, key: str) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime", additional_headers=_auth(key))
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client


async def test_registered_voice_speaks_a_later_sessions_reply(server, engine, clip, monkeypatch):
    """The talker's prompt gets the clone's own speaker embedding and prompt-latent embeddings."""
    from openai.types.audio import Voice

    body = await _register(server, clip)
    Voice.model_validate(body)  # OpenAI's `audio.voice` shape
    assert body["id"].startswith("voice_") and body["name"] == "mine" and body["speaker_embedding"] is True
    stored = server.voice_routes.store.get(server.voice_routes.owner(KEY_A), body["id"])
    assert stored is not None and stored.prompt.num_patches > 0
    default_prompt, _ = engine.bundle.voices[engine.bundle.default_voice]
    assert default_prompt.spk_embed is None  # the tiny preset: the clone's embedding cannot be the default's

    seen = []
    talker = engine.bundle.talker
    original = talker.prompt_embeds
    monkeypatch.setattr(talker, "prompt_embeds", lambda prompt, spk=(), emb=None: (
        seen.append((list(spk), emb)), original(prompt, spk, emb))[1])

    client = await _session(server, KEY_A)
    await client.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": body["id"]}}}})
    updated = (await client.recv_until("session.updated"))[-1]
    assert updated["session"]["audio"]["output"]["voice"] == body["id"]
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something."}]})
    await client.send(type="response.create", response={"max_output_tokens": 48})  # tiny model: no EOS
    frames = await client.recv_until("response.done", timeout=60)
    assert frames[-1]["response"]["status"] in ("completed", "incomplete"), frames[-1]
    assert frames[-1]["response"]["audio"]["output"]["voice"] == body["id"]
    assert any(f["type"] == "response.output_audio.delta" for f in frames), [f["type"] for f in frames]
    assert seen, "the talker never built a prompt"
    for spk, emb in seen:
        assert len(spk) == 1 and spk[0] is stored.prompt.spk_embed
        assert emb is stored.prompt.prompt_emb
    await client.ws.close()


async def test_voices_are_private_to_their_api_key(server, clip):
    body = await _register(server, clip, KEY_A)
    listed = await asyncio.to_thread(requests.get, _url(server), headers=_auth(KEY_B), timeout=10)
    assert listed.status_code == 200 and listed.json() == {"object": "list", "data": []}
    for method in (requests.get, requests.delete):
        r = await asyncio.to_thread(method, _url(server, "/" + body["id"]), headers=_auth(KEY_B), timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "voice_not_found"
    client = await _session(server, KEY_B)
    await client.send(type="session.update", event_id="u1",
                      session={"type": "realtime", "audio": {"output": {"voice": {"id": body["id"]}}}})
    error = await client.expect_error("voice_not_found")
    assert error["param"] == "session.audio.output.voice" and error["event_id"] == "u1"
    await client.send(type="response.create", response={"audio": {"output": {"voice": {"id": "voice_nope"}}}})
    error = await client.expect_error("voice_not_found")
    assert error["param"] == "response.voice"
    await client.ws.close()
    mine = await asyncio.to_thread(requests.get, _url(server), headers=_auth(KEY_A), timeout=10)
    assert [v["id"] for v in mine.json()["data"]] == [body["id"]]
    gone = await asyncio.to_thread(requests.delete, _url(server, "/" + body["id"]), headers=_auth(KEY_A), timeout=10)
    assert gone.json() == {"id": body["id"], "object": "audio.voice.deleted", "deleted": True}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"api-key": "wrong"}])
async def test_wrong_api_key_is_401(server, clip, headers):
    samples, rate = clip
    r = await asyncio.to_thread(requests.post, _url(server), headers=headers, timeout=10,
                                files={"audio_sample": ("a.wav", _wav(samples, rate))}, data={"transcript": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def _bad_uploads(clip):
    samples, rate = clip
    good = _wav(samples, rate)
    stereo3 = np.stack([samples] * 3, axis=1)
    return {
        "corrupt": (dict(files={"audio_sample": ("a.wav", b"RIFF" + b"\x00" * 400)}, data={"transcript": "x"}),
                    400, "invalid_audio"),
        "too_short": (dict(files={"audio_sample": ("a.wav", _wav(samples[: rate // 2], rate))},
                           data={"transcript": "x"}), 400, "audio_too_short"),
        "too_long": (dict(files={"audio_sample": ("a.wav", _wav(np.tile(samples, 5), rate))},
                          data={"transcript": "x"}), 400, "audio_too_long"),
        "silent": (dict(files={"audio_sample": ("a.wav", _wav(np.zeros(rate * 2, np.float32), rate))},
                        data={"transcript": "x"}), 400, "audio_silent"),
        "low_rate": (dict(files={"audio_sample": ("a.wav", _wav(np.zeros(8000, np.float32) + 0.1, 4000))},
                          data={"transcript": "x"}), 400, "unsupported_sample_rate"),
        "channels": (dict(files={"audio_sample": ("a.wav", _wav(stereo3, rate))}, data={"transcript": "x"}),
                     400, "unsupported_channels"),
        "no_transcript": (dict(files={"audio_sample": ("a.wav", good)}), 400, "missing_transcript"),
        "blank_transcript": (dict(files={"audio_sample": ("a.wav", good)}, data={"transcript": "  "}),
                             400, "missing_transcript"),
        "no_audio": (dict(data={"transcript": "x"}, files={"name": (None, "n")}), 400, "missing_audio"),
        "unknown_field": (dict(files={"audio_sample": ("a.wav", good)}, data={"transcript": "x", "consent": "c"}),
                          400, "unknown_parameter"),
        "too_big": (dict(files={"audio_sample": ("a.wav", b"\x00" * 1_200_000)}, data={"transcript": "x"}),
                    413, "request_too_large"),
        "bad_json": (dict(data=b"{not json", headers={"Content-Type": "application/json"}), 400, "invalid_json"),
        "bad_base64": (dict(json={"audio": "!!!", "transcript": "x"}), 400, "invalid_base64"),
        "content_type": (dict(data=good, headers={"Content-Type": "audio/wav"}), 415, "unsupported_content_type"),
    }


async def test_bad_uploads_get_clear_errors_and_the_server_lives(server, clip):
    for case, (kwargs, status, code) in _bad_uploads(clip).items():
        headers = {**_auth(KEY_A), **kwargs.pop("headers", {})}
        r = await asyncio.to_thread(requests.post, _url(server), headers=headers, timeout=30, **kwargs)
        assert r.status_code == status, (case, r.text)
        error = r.json()["error"]
        assert error["code"] == code and error["message"], (case, error)
    assert server.voice_routes.store.list(server.voice_routes.owner(KEY_A)) == []
    health = await asyncio.to_thread(requests.get, f"http://127.0.0.1:{server.port}/health", timeout=10)
    assert health.status_code == 200
    # a JSON registration (base64) still works afterwards, and stereo FLAC at 48 kHz is accepted
    samples, rate = clip
    flac = _wav(np.stack([samples, samples], axis=1), rate, subtype="PCM_16", fmt="FLAC")
    r = await _post(server, json={"audio": base64.b64encode(flac).decode(), "transcript": TRANSCRIPT})
    assert r.status_code == 200, r.text


async def test_the_store_evicts_the_least_recently_used_voice_of_a_key(server, clip):
    first = await _register(server, clip, name="one")
    second = await _register(server, clip, name="two")
    client = await _session(server, KEY_A)  # using `first` makes `second` the least recently used
    await client.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": first["id"]}}}})
    await client.recv_until("session.updated")
    third = await _register(server, clip, name="three")
    listed = await asyncio.to_thread(requests.get, _url(server), headers=_auth(KEY_A), timeout=10)
    assert sorted(v["id"] for v in listed.json()["data"]) == sorted([first["id"], third["id"]])
    await client.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": second["id"]}}}})
    await client.expect_error("voice_not_found")
    await client.ws.close()


def _voice(voice_id: str, owner: str, nbytes: int) -> CustomVoice:
    empty = torch.zeros(1, 0, 4)
    return CustomVoice(voice_id, owner, voice_id, VoicePrompt(None, empty, empty), "t", 1.0, nbytes)


def test_voice_store_bounds_count_owner_and_bytes():
    """Past its quota an owner evicts only its own least recently used voices; owners never cross."""
    store = VoiceStore(max_voices=3, max_per_owner=2, max_bytes=100)  # one owner (no keys): the whole store
    assert store.add(_voice("voice_a1", "a", 10)) == []
    store.add(_voice("voice_a2", "a", 10))
    assert [v.id for v in store.add(_voice("voice_a3", "a", 10))] == ["voice_a1"]  # per-owner count
    assert store.get("a", "voice_a2") is not None  # a2 used: a3 is now the oldest
    assert [v.id for v in store.add(_voice("voice_a4", "a", 95))] == ["voice_a3", "voice_a2"]  # bytes
    assert store.get("b", "voice_a4") is None and not store.delete("b", "voice_a4")  # owners never cross
    with pytest.raises(ValueError):
        store.add(_voice("voice_big", "a", 101))


def test_voice_store_quotas_never_evict_another_owner():
    """Four owners share 8 voices and 400 bytes: each keeps 2 voices and 100 bytes whatever the others do."""
    store = VoiceStore(max_voices=8, max_per_owner=16, max_bytes=400, owners=4)
    assert (store.max_per_owner, store.max_owner_bytes) == (2, 100)
    mine = [_voice("voice_k0a", "k0", 10), _voice("voice_k0b", "k0", 10)]
    for voice in mine:
        assert store.add(voice) == []
    for k in range(1, 4):  # the other owners register far past their quotas
        for n in range(20):
            evicted = store.add(_voice(f"voice_k{k}_{n}", f"k{k}", 30 + n))
            assert all(v.owner == f"k{k}" for v in evicted)
    assert [v.id for v in store.list("k0")] == [v.id for v in mine]  # untouched
    assert len(store) <= 8 and store.nbytes <= 400
    with pytest.raises(ValueError):  # over one owner's byte share
        store.add(_voice("voice_k0c", "k0", 101))


def test_voice_store_oversubscribed_refuses_rather_than_evicts():
    """More owners than voices (quota rounds up to 1): a full store refuses the newcomer, keeps the others."""
    store = VoiceStore(max_voices=2, max_per_owner=4, max_bytes=100, owners=3)
    store.add(_voice("voice_a", "a", 10))
    store.add(_voice("voice_b", "b", 10))
    with pytest.raises(VoiceStoreFull):
        store.add(_voice("voice_c", "c", 10))
    assert [v.id for v in store.add(_voice("voice_a2", "a", 10))] == ["voice_a"]  # its own, to make room
    assert store.get("b", "voice_b") is not None


def test_openai_voice_names_are_documented_aliases_of_the_default():
    voices = SessionVoices(["DB30"], "DB30", lambda _id: None)
    for name in OPENAI_VOICE_ALIASES:
        assert name in voices and voices.engine_voice(name) == "DB30"
    assert "voice_x" not in voices and "nobody" not in voices
    assert DEFAULT_VOICE == "DB30"


def test_docs_name_the_voice_endpoint_and_the_alias_rule():
    from conftest import REPO

    for doc in ("docs/realtime_api.md", "docs/protocol.md"):  # the field table and the wire facts
        text = (REPO / doc).read_text()
        assert "/v1/realtime/voices" in text and "voice_not_found" in text, doc
    assert json.dumps(list(OPENAI_VOICE_ALIASES))  # the names the docs list


async def test_sdk_register_voice_and_use_it(server, clip):
    """The SDK helper registers from samples, lists, and maps refusals to VoiceError / AuthenticationError."""
    from realtime_ming.sdk import AuthenticationError, VoiceError, delete_voice, list_voices, register_voice

    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    samples, rate = clip
    voice = await register_voice(url, samples, TRANSCRIPT, name="sdk", api_key=KEY_A, sample_rate=rate)
    assert voice.id.startswith("voice_") and voice.name == "sdk"
    assert [v.id for v in await list_voices(url, api_key=KEY_A)] == [voice.id]
    with pytest.raises(VoiceError) as bad:
        await register_voice(url, samples[: rate // 4], TRANSCRIPT, api_key=KEY_A, sample_rate=rate)
    assert bad.value.status == 400 and bad.value.code == "audio_too_short" and bad.value.param == "audio_sample"
    with pytest.raises(AuthenticationError):
        await list_voices(url, api_key="wrong")
    await delete_voice(url, voice.id, api_key=KEY_A)
    with pytest.raises(VoiceError) as gone:
        await delete_voice(url, voice.id, api_key=KEY_A)
    assert gone.value.status == 404 and gone.value.code == "voice_not_found"


def test_the_session_voice_outlives_eviction_and_other_voices_resolved_since():
    """A session's cloned voice, evicted from the store and pushed out of the session's recent voices by
    response-level voices, still speaks its replies: never silently the default preset."""
    from session_support import Harness

    from realtime_ming.server.config import AuthConfig, VoicesConfig
    from realtime_ming.server.voice_routes import VoiceRoutes

    routes = VoiceRoutes(VoicesConfig(max_voices_per_key=2), AuthConfig(), lambda: None)
    try:
        owner = routes.owner(None)
        mine = _voice("voice_mine", owner, 10)
        routes.store.add(mine)
        h = Harness(custom_voices=routes.lookup_for(None))
        h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": mine.id}}}})
        assert h.last("session.updated")["session"]["audio"]["output"]["voice"] == mine.id
        for k in range(6):  # each registration evicts the key's oldest; each response resolves another voice
            other = _voice(f"voice_other{k}", owner, 10)
            routes.store.add(other)
            h.send(type="response.create", response={"output_modalities": ["text"],
                                                     "audio": {"output": {"voice": {"id": other.id}}}})
            h.finish_turn(h.submitted()[-1].turn_id)
        assert routes.store.get(owner, mine.id) is None  # evicted long ago
        h.send(type="response.create", event_id="r1")
        assert not [f for f in h.frames if f["type"] == "error"], [f for f in h.frames if f["type"] == "error"]
        assert h.submitted()[-1].voice is mine
        assert h.session._accepted_voices.engine_voice(mine.id) is mine  # what a server-VAD reply is spoken with
    finally:
        routes.close()
