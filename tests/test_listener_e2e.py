"""Barge-in as a listener hears it, through the real server with espeak-ng speech streamed in real time.

The client is `bench.barge_in`'s standard client: it plays every audio delta in order at real time from its
arrival and flushes on speech_started. The reply comes from a scripted engine, either fully generated at once (a
fast GPU: the reply is generated and still playing) or in real time (still generating), so the state of the reply
at the clip's onset is known. Every frame is validated against the openai SDK's server-event union. Bounds are
structural (audio received, positions); the latencies themselves are `bench.barge_in --listener`'s to measure.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from conftest import tiny_engine_fixture
from server_support import WsClient, seconds, stub_served, validate_frame
from websockets.asyncio.client import connect

from bench.barge_in import STORY, Clip, analyse_trial, listener_trial, played
from bench.end_of_turn import espeak
from realtime_ming.protocol import Dialect

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(300)]
LEAD_MS = 150  # the shipped default of realtime_ming.output_lead_ms
WIRE_HZ = 24000
GENERATED = {"words": ("word ",) * 120, "chunk_s": 0.1, "step_s": 0.002}  # 12 s of audio in ~0.3 s
GENERATING = {"words": ("word ",) * 80, "chunk_s": 0.1, "step_s": 0.05}  # 8 s of audio in about 4 s

engine = tiny_engine_fixture(forced_reply=STORY)  # the real tiny engine, telling a story


def _clip(kind: str, text: str, voice: str = "en-us") -> Clip:
    return Clip(kind, text, espeak(text, voice))


def _validated(trial: dict) -> dict:
    for _, frame in trial["frames"]:
        validate_frame(frame, Dialect.GA, allow_timings=True)
    return trial


def _response_done(trial: dict) -> dict:
    return next(f["response"] for _, f in trial["frames"] if f["type"] == "response.done")


def _received_after_ms(trial: dict, t: float) -> float:
    """Audio of the reply (not of the response to the interruption) that arrived after client time `t`."""
    return sum(len(base64.b64decode(f["delta"])) / 2 / WIRE_HZ * 1000.0 for at, f in trial["frames"]
               if f["type"] == "response.output_audio.delta" and f["response_id"] == trial["response_id"] and at > t)


@pytest.mark.parametrize("text", ["No, I meant the other one.", "Stop.", "Wait, stop."])
@pytest.mark.parametrize("stub", [GENERATED, GENERATING], ids=["generated", "generating"])
async def test_a_real_interruption_stops_what_the_listener_hears(stub, text):
    """An interruption 1.2 s into playback, a sentence or a stop word said alone (one short burst, like a
    backchannel, read as a command when it ends): speech_started, the response is cancelled (turn_detected), and
    the audio the client received after the onset is bounded by the lead plus the detector's first windows
    (unpaced, a fully generated reply would have put all of it at the client)."""
    async with stub_served(**stub) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        trial = _validated(await listener_trial(url, [(_clip("interruption", text), 1.2)], 4096, {}))
        (row,), _ = analyse_trial(trial)
        assert row["playing"] and row["detected"], row
        done = _response_done(trial)
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
        assert _received_after_ms(trial, trial["onsets"][0]) <= LEAD_MS + seconds(300.0)
        assert row["stop_ms"] <= LEAD_MS + seconds(400.0), row


@pytest.mark.parametrize("stub", [GENERATED, GENERATING], ids=["generated", "generating"])
async def test_a_backchannel_does_not_stop_the_reply_and_nothing_is_lost(stub):
    """"mm-hmm" 1.2 s into playback: no speech_started, the response completes, and the item's audio (retrieved)
    is byte for byte what the client received and played."""
    async with stub_served(**stub) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        trial = _validated(await listener_trial(url, [(_clip("other", "mm-hmm"), 1.2)], 4096, {}))
        (row,), _ = analyse_trial(trial)
        assert row["playing"] and not row["stopped"] and row["complete"], row
        assert _response_done(trial)["status"] == "completed"
        assert row["pause_ms"] < seconds(1500.0), row


@pytest.mark.parametrize(("text", "voice"), [("okay", "en-us"), ("uh-huh", "en-us+m3")])
async def test_a_two_syllable_backchannel_never_stops_the_reply(text, voice):
    """"okay" / "uh-huh" 8 times over one playing reply, each 101 mic frames (2.02 s) after the one before: the
    server's stream clock counts 20 ms frames, Silero's windows 32 ms, so the 8 clips start at the 8 phases a frame can
    have against the windows, among them those where the word dips for two windows between its syllables (a second
    word with a 64 ms word gap: "uh-huh" [en-us+m3] cancelled the reply). No speech_started, the response completes,
    the item's audio is what the client received."""
    long_reply = {**GENERATED, "words": ("word ",) * 220}  # 22 s of audio
    async with stub_served(**long_reply) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        okay = _clip("other", text, voice)
        trial = _validated(await listener_trial(url, [(okay, 1.2 + 2.02 * i) for i in range(8)], 4096, {}))
        frames_per_onset = sorted(round((at - trial["onsets"][0]) / 0.02) % 8 for at in trial["onsets"])
        assert frames_per_onset == list(range(8)), frames_per_onset
        rows, _ = analyse_trial(trial)
        assert all(row["playing"] and not row["stopped"] for row in rows), rows
        assert not any(f["type"] == "input_audio_buffer.speech_started" for _, f in trial["frames"])
        assert _response_done(trial)["status"] == "completed"
        assert rows[-1]["complete"], rows[-1]


async def test_the_client_never_holds_more_than_the_lead():
    """A 12 s reply generated in a fraction of a second: at every delta's arrival the client's unplayed audio is
    within the lead (a frame of slack for the loopback); the reply arrives whole."""
    async with stub_served(**GENERATED) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        trial = _validated(await listener_trial(url, [], 4096, {}))
        deltas = [(t, len(base64.b64decode(f["delta"])) // 2) for t, f in trial["frames"]
                  if f["type"] == "response.output_audio.delta"]
        segments = played(deltas, None)
        leads = [(sum(n for _, n in deltas[: i + 1]) / WIRE_HZ - (t - segments[0][0]) - _stalls(segments, t)) * 1e3
                 for i, (t, _) in enumerate(deltas)]
        assert max(leads) <= LEAD_MS + 40.0, max(leads)
        assert sum(n for _, n in deltas) / WIRE_HZ == pytest.approx(12.0, abs=0.1)
        assert _response_done(trial)["status"] == "completed"


def _stalls(segments: list[tuple[float, float]], t: float) -> float:
    """Seconds the playback stood still (waiting for audio) before `t`."""
    return sum(max(0.0, min(b0, t) - a1) for (_, a1), (b0, _) in zip(segments, segments[1:]) if a1 < t)


async def test_output_audio_buffer_round_trip_and_truncation_at_the_played_position():
    """Opted in to the playout events: started after the first delta; the client's output_audio_buffer.clear 1.5 s
    into playback cancels the response (client_cancelled), truncates its item at the played position (the
    client's own clock, within the loopback's slack) and is answered cleared; a second reply played to its end
    is followed by stopped, after its response.done."""
    async with stub_served(**GENERATED) as srv, connect(f"ws://127.0.0.1:{srv.port}/v1/realtime") as ws:
        client = WsClient(ws, Dialect.GA)
        client.allow_playout = True
        await client.recv_until("session.created")
        await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}},
                                                          "realtime_ming": {"output_audio_buffer": True}})
        await client.recv_until("session.updated")
        await client.send(type="response.create")
        loop = asyncio.get_running_loop()
        first = (await client.recv_until("response.output_audio.delta", timeout=30))[-1]
        first_at = loop.time()
        response_id, item_id = first["response_id"], first["item_id"]
        frames = await client.recv_until("output_audio_buffer.started")
        assert frames[-1]["response_id"] == response_id
        await asyncio.sleep(1.5 - (loop.time() - first_at))
        played_ms = (loop.time() - first_at) * 1000.0
        await client.send(type="output_audio_buffer.clear")
        frames = await client.recv_until("output_audio_buffer.cleared")
        types = [f["type"] for f in frames]
        done = next(f["response"] for f in frames if f["type"] == "response.done")
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")
        truncated = next(f for f in frames if f["type"] == "conversation.item.truncated")
        assert truncated["item_id"] == item_id and types.index("conversation.item.truncated") > types.index("response.done")
        assert abs(truncated["audio_end_ms"] - played_ms) <= seconds(100.0), (truncated, played_ms)
        assert frames[-1]["response_id"] == response_id
        assert not any(f["type"] == "response.output_audio.delta" for f in frames[types.index("response.done"):])

        await client.send(type="session.update", session={"type": "realtime", "max_output_tokens": 8})
        await client.send(type="response.create")
        frames = await client.recv_until("output_audio_buffer.stopped", timeout=60)
        types = [f["type"] for f in frames]
        assert types.index("output_audio_buffer.started") < types.index("response.done") < len(types) - 1
        assert frames[-1]["response_id"] == frames[types.index("response.done")]["response"]["id"]


async def test_a_real_interruption_frees_the_engine_at_once(engine):
    """The real tiny engine mid-reply: at the interruption's speech_started the turn is cancelled and its thinker
    row and talker stream are free, while the user's speech goes on to become the next turn (one response)."""
    from realtime_ming.server import RealtimeServer, load_config

    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        speech = _clip("interruption", "No, I meant the other one, the blue one.")
        trial = _validated(await listener_trial(url, [(speech, 0.3)], 4096, {}))
        frames = [f for _, f in trial["frames"]]
        types = [f["type"] for f in frames]
        assert "input_audio_buffer.speech_started" in types
        done = _response_done(trial)
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
        stats = await asyncio.to_thread(engine.stats)
        assert stats.thinker_rows <= 1 and stats.talker_streams <= 1, stats  # at most the next turn's
        assert types.count("input_audio_buffer.committed") == 1
        assert types.count("response.created") == 2  # the interruption became the next turn
        assert np.all([f["response"]["id"] != done["id"] for f in frames if f["type"] == "response.created"][1:])
