"""The sans-I/O parts of WebRTC calls and ephemeral keys: the playout queue and the client-secret store."""

from __future__ import annotations

import numpy as np
import pytest

from realtime_ming.rtc.channel import DEFAULT_MAX_MESSAGE_BYTES, peer_max_message
from realtime_ming.rtc.playout import FRAME_SAMPLES, RATE_HZ, Cut, Playout
from realtime_ming.server.client_secrets import ClientSecrets, SecretsFull
from realtime_ming.server.config import ClientSecretsConfig


def _tone(ms: int, value: int = 1000) -> np.ndarray:
    return np.full(RATE_HZ * ms // 1000, value, np.int16)


def _types(events) -> list[tuple[str, str]]:
    return [(e.type, e.response_id) for e in events]


def test_playout_plays_in_frames_and_says_started_then_stopped_after_the_end():
    playout = Playout()
    playout.push("r1", "i1", _tone(50))
    frame, events = playout.pull()
    assert frame.size == FRAME_SAMPLES and (frame == 1000).all()
    assert _types(events) == [("output_audio_buffer.started", "r1")]
    assert playout.end("r1") == []  # 10 ms still waiting
    _, events = playout.pull()
    assert events == []
    frame, events = playout.pull()
    assert (frame[: FRAME_SAMPLES // 2] == 1000).all() and (frame[FRAME_SAMPLES // 2:] == 0).all()
    assert _types(events) == [("output_audio_buffer.stopped", "r1")]
    frame, events = playout.pull()
    assert not frame.any() and events == [] and playout.buffered == 0


def test_playout_underrun_is_not_a_stop_and_an_ended_drained_response_stops_at_once():
    playout = Playout()
    playout.push("r1", "i1", _tone(20))
    assert _types(playout.pull()[1]) == [("output_audio_buffer.started", "r1")]
    assert playout.pull()[1] == []  # generation is behind: silence, still playing
    assert playout.playing()
    assert _types(playout.end("r1")) == [("output_audio_buffer.stopped", "r1")]
    assert not playout.playing()


def test_playout_clear_cuts_each_item_at_its_played_position_and_mutes_the_response():
    playout = Playout()
    playout.push("r1", "i1", _tone(100))
    for _ in range(3):
        playout.pull()
    events, cuts = playout.clear(explicit=False)
    assert _types(events) == [("output_audio_buffer.cleared", "r1")]
    assert cuts == [Cut("i1", 60)] and playout.buffered == 0
    playout.push("r1", "i1", _tone(100))  # the cleared response goes on generating: never played
    frame, events = playout.pull()
    assert not frame.any() and events == []
    assert playout.end("r1") == []  # no stopped for a cleared response
    assert playout.clear(explicit=False) == ([], [])  # nothing plays: a barge-in clears nothing
    events, cuts = playout.clear(explicit=True)  # the client's clear names the last response heard
    assert _types(events) == [("output_audio_buffer.cleared", "r1")] and cuts == []


def test_playout_interleaved_responses_start_and_stop_each():
    playout = Playout()
    playout.push("r1", "i1", _tone(20))
    playout.push("r2", "i2", _tone(20, 2000))
    assert playout.end("r1") == [] and playout.end("r2") == []
    _, first = playout.pull()
    _, second = playout.pull()
    assert _types(first) == [("output_audio_buffer.started", "r1"), ("output_audio_buffer.stopped", "r1")]
    assert _types(second) == [("output_audio_buffer.started", "r2"), ("output_audio_buffer.stopped", "r2")]


def test_peer_max_message_size_from_the_offer():
    assert peer_max_message("v=0\r\na=max-message-size:262144\r\n") == 262144
    assert peer_max_message("v=0\r\n") == DEFAULT_MAX_MESSAGE_BYTES
    assert peer_max_message("v=0\r\na=max-message-size:0\r\n") > 262144


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_client_secrets_expire_spend_and_stay_bounded():
    clock = _Clock()
    store = ClientSecrets(ClientSecretsConfig(max_secrets=3, max_secrets_per_key=2), clock)
    value, expires_at = store.mint("k1", {"instructions": "x"}, 60)
    assert value.startswith("ek_") and expires_at == 1_000_060 and len(value) > 40
    assert store.peek(value).owner == "k1"
    clock.now += 59
    assert store.redeem(value).session == {"instructions": "x"}
    assert store.redeem(value) is None  # single use
    store.mint("k1", {}, 10)
    store.mint("k1", {}, 10)
    with pytest.raises(SecretsFull, match="this API key"):
        store.mint("k1", {}, 10)
    store.mint("k2", {}, 10)
    with pytest.raises(SecretsFull, match="this server"):
        store.mint("k3", {}, 10)
    clock.now += 10  # expiry frees their room
    assert len(store) == 0
    late, _ = store.mint("k1", {}, 10)
    clock.now += 10
    assert store.peek(late) is None and store.redeem(late) is None


def test_client_secrets_multi_use_and_revocation_by_owner_only():
    store = ClientSecrets(ClientSecretsConfig(single_use=False))
    value, _ = store.mint("k1", {}, 60)
    assert store.redeem(value) is not None and store.redeem(value) is not None
    assert not store.revoke("k2", value) and store.peek(value) is not None
    assert store.revoke("k1", value) and store.redeem(value) is None
    for _ in range(3):
        store.mint("k1", {}, 60)
    store.mint("k2", {}, 60)
    assert store.revoke_all("k1") == 3 and len(store) == 1
