"""Camera and video turns (issue 19 item 3), end to end on loopback against the tiny engine.

Camera frames are GA `input_image` items created while the user's audio streams in: they reach
the turn's prompt in the order they were added, before the committed speech. A short clip travels
as the `input_video` extension (timed image frames, or a data:video URL decoded with PyAV) and
reaches the engine as Ming's VIDEO content sampled on the reference's 2 fps grid, already at the
per-frame size the engine's own preprocessing keeps. Every server frame validates against the
`openai` package's GA types; bad clips get specific error codes with the param path and leave
the conversation working.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from server_support import RecordingEngine, WsClient, pcm16_b64, seconds, tone
from websockets.asyncio.client import connect

from realtime_ming.engine.api import ContentKind
from realtime_ming.model.image_processing import (
    VideoSampling,
    preprocess_video,
    video_frame_indices,
)
from realtime_ming.protocol import Dialect
from realtime_ming.protocol.items import VideoFrame
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.session.content import (
    MediaLimits,
    decode_video_frames,
    decode_video_url,
)
from media_support import _jpeg, _mp4, _solid

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine():
    """The tiny engine with a fixed reply (its random-weight text cannot be spoken; every stage still
    runs, the video prefill included), so that a spoken answer has audio."""
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.hooks import EngineHooks

    eng = Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply="I see a square moving."))
    yield eng
    eng.close()


@pytest.fixture
async def spy(engine):
    spy = RecordingEngine(engine)
    async with RealtimeServer(load_config(None, ["server.port=0"]), spy) as srv:
        spy.url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        yield spy


async def _client(url: str, dialect: Dialect = Dialect.GA):
    headers = {"OpenAI-Beta": "realtime=v1"} if dialect is Dialect.BETA else {}
    ws = await connect(url, additional_headers=headers, max_size=2**26)
    client = WsClient(ws, dialect)
    await client.recv_until("session.created")
    return client


# ---- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "src_fps"), [(30, 10.0), (90, 30.0), (7, 2.0), (1, 1.0), (5, 1.0)])
def test_clip_is_sampled_on_the_reference_grid_and_the_engine_keeps_it(count, src_fps):
    """Frames at `src_fps` → VIDEO content at Ming's 2 fps: V1's frame count (duration·fps, at
    least min(min_frames, n), even), each content frame the source frame shown at k/2 s, and
    the engine's own `preprocess_video` keeps every frame without resizing."""
    sampling = VideoSampling()
    frames = tuple(VideoFrame(_jpeg(_solid(2 * k)), k / src_fps) for k in range(count))
    content = decode_video_frames(frames, "item.content[0]")
    assert content.kind is ContentKind.VIDEO and content.fps == sampling.fps
    v1_count = max(int(count / src_fps * sampling.fps), min(sampling.min_frames, count))
    assert content.video.shape[0] == v1_count + v1_count % sampling.frame_factor
    for k, frame in enumerate(content.video):
        shown = min(int(k / sampling.fps * src_fps + 1e-6), count - 1)
        assert int(frame[0, 0, 0]) == 2 * shown
    vision, kept = preprocess_video(content.video, content.fps)
    assert kept == list(range(content.video.shape[0]))
    assert video_frame_indices(content.video.shape[0], content.fps) == kept
    assert vision.resized_hw == content.video.shape[1:3]


def test_video_url_gives_the_frames_a_frame_list_gives():
    """An mp4 of the same frames decodes (PyAV) to the same sampled timeline and frame size."""
    rgb = [_solid(8 * k) for k in range(20)]
    from_frames = decode_video_frames(tuple(VideoFrame(_jpeg(f), k / 10) for k, f in enumerate(rgb)), "p")
    url = "data:video/mp4;base64," + base64.b64encode(_mp4(rgb, 10)).decode()
    from_url = decode_video_url(url, "p")
    assert from_url.video.shape == from_frames.video.shape and from_url.fps == from_frames.fps
    # lossy mpeg4: the grey levels of the sampled frames agree within codec noise
    assert np.abs(from_url.video.astype(int) - from_frames.video.astype(int)).mean(axis=(1, 2, 3)).max() < 6


def test_clip_limits_are_checked_before_decoding():
    limits = MediaLimits(max_video_s=2.0)
    frames = tuple(VideoFrame(_jpeg(_solid(0)), t) for t in (0.0, 1.0, 2.5))
    with pytest.raises(Exception) as too_long:
        decode_video_frames(frames, "item.content[0]", limits)
    assert too_long.value.code == "video_too_long" and too_long.value.param == "item.content[0].frames"
    tiny = tuple(VideoFrame(_jpeg(_solid(0, (8, 8))), 0.0) for _ in range(1))
    with pytest.raises(Exception) as small:
        decode_video_frames(tiny, "item.content[0]")
    assert small.value.code == "image_too_small" and small.value.param == "item.content[0].frames[0].image_url"


# ---- over the socket -------------------------------------------------------------------------------


async def test_camera_frames_during_a_spoken_turn_are_prompted_in_order(spy):
    """Three camera frames created while the user's audio streams in are in the reply's prompt, in
    order, before the committed speech; every echoed frame validates as GA."""
    client = await _client(spy.url)
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}},
                                                      "max_output_tokens": 4})
    await client.recv_until("session.updated")
    speech = tone(0.9)
    shades = (40, 120, 200)
    for k, shade in enumerate(shades):
        await client.send(type="input_audio_buffer.append", audio=pcm16_b64(speech[k * 7200:(k + 1) * 7200]))
        await client.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_image", "image_url": _jpeg(_solid(shade))}]})
        await client.recv_until("conversation.item.done")
    await client.send(type="input_audio_buffer.commit")
    await client.recv_until("conversation.item.done")
    await client.send(type="response.create")
    done = await client.recv_until("response.done", timeout=60)
    assert done[-1]["response"]["status"] in ("completed", "incomplete")
    history = spy.requests[-1].history
    kinds = [[c.kind for c in m.content] for m in history]
    assert kinds == [[ContentKind.IMAGE]] * 3 + [[ContentKind.AUDIO]]
    assert [int(m.content[0].image[0, 0, 0]) for m in history[:3]] == list(shades)
    await client.ws.close()


async def test_video_clip_turn_is_answered_and_echoed_as_a_summary(spy):
    """A frames clip is stored (echo: `input_image` + `video` summary, no payload), prompted as VIDEO
    content and answered; a data:video clip the same; `retrieve` shows the same summary."""
    client = await _client(spy.url)
    await client.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                      "max_output_tokens": 4})
    await client.recv_until("session.updated")
    frames = [{"image_url": _jpeg(_solid(10 * k)), "timestamp_s": k / 4} for k in range(10)]
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user",
        "content": [{"type": "input_video", "frames": frames}, {"type": "input_text", "text": "What happens?"}]})
    added = (await client.recv_until("conversation.item.added"))[-1]
    part = added["item"]["content"][0]
    assert part == {"type": "input_image", "video": {"num_frames": 10, "duration_s": 2.25}}  # as sent
    await client.send(type="response.create")
    assert (await client.recv_until("response.done", timeout=60))[-1]["response"]["status"] != "failed"
    video = spy.requests[-1].history[-1].content[0]
    assert video.kind is ContentKind.VIDEO and video.video.shape[0] == 6
    await client.send(type="conversation.item.retrieve", item_id=added["item"]["id"])
    retrieved = (await client.recv_until("conversation.item.retrieved"))[-1]
    assert retrieved["item"]["content"][0] == part

    clip = "data:video/mp4;base64," + base64.b64encode(_mp4([_solid(8 * k) for k in range(20)], 10)).decode()
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_video", "video_url": clip}]})
    assert (await client.recv_until("conversation.item.done"))[-1]["item"]["content"][0]["video"]["num_frames"] == 20
    await client.send(type="response.create")
    assert (await client.recv_until("response.done", timeout=60))[-1]["response"]["status"] != "failed"
    assert spy.requests[-1].history[-1].content[0].kind is ContentKind.VIDEO
    await client.ws.close()


@pytest.mark.parametrize(("part", "code", "param"), [
    ({"type": "input_video"}, "invalid_video", "item.content[0]"),
    ({"type": "input_video", "frames": []}, "invalid_video", "item.content[0].frames"),
    ({"type": "input_video", "frames": [{"image_url": "x", "timestamp_s": 0}]}, "invalid_image",
     "item.content[0].frames[0].image_url"),
    ({"type": "input_video", "frames": [{"image_url": "data:image/png;base64,AAAA", "timestamp_s": 1},
                                        {"image_url": "data:image/png;base64,AAAA", "timestamp_s": 1}]},
     "invalid_video", "item.content[0].frames[1].timestamp_s"),
    ({"type": "input_video", "frames": [{"image_url": "data:image/png;base64,AAAA", "timestamp_s": 0, "x": 1}]},
     "invalid_value", "item.content[0].frames[0].x"),
    ({"type": "input_video", "frames": [{"image_url": "data:image/png;base64,AAAA", "timestamp_s": 0}]},
     "invalid_image", "item.content[0].frames[0].image_url"),
    ({"type": "input_video", "video_url": "data:image/png;base64,AAAA"}, "invalid_video", "item.content[0].video_url"),
    ({"type": "input_video", "video_url": "data:video/mp4;base64,AAAAAAAA"}, "invalid_video",
     "item.content[0].video_url"),
    ({"type": "input_video", "frames": [{"image_url": "data:image/png;base64,AAAA", "timestamp_s": t}
                                        for t in (0, 61)]}, "video_too_long", "item.content[0].frames"),
])
async def test_bad_clips_get_their_code_and_the_conversation_goes_on(server, part, code, param):
    client = await _client(f"ws://127.0.0.1:{server.port}/v1/realtime")
    if code == "video_too_long":  # valid frames, only the span is over the limit
        part["frames"] = [dict(f, image_url=_jpeg(_solid(0))) for f in part["frames"]]
    await client.send(type="conversation.item.create", event_id="evt_bad",
                      item={"type": "message", "role": "user", "content": [part]})
    error = await client.expect_error(code)
    assert error["param"] == param and error["event_id"] == "evt_bad"
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "still here"}]})
    assert (await client.recv_until("conversation.item.done"))[-1]["item"]["content"][0]["text"] == "still here"
    await client.ws.close()


async def test_beta_has_no_video(server):
    client = await _client(f"ws://127.0.0.1:{server.port}/v1/realtime", Dialect.BETA)
    await client.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_video", "frames": [{"image_url": _jpeg(_solid(0)), "timestamp_s": 0}]}]})
    assert (await client.expect_error("invalid_value"))["param"] == "item.content[0].type"
    await client.ws.close()


async def test_sdk_add_video_sends_frames_and_reads_the_summary(spy):
    """`RealtimeClient.add_video(frames, fps=...)`: the clip is prompted as VIDEO and the SDK parses the
    stored summary the server echoes."""
    from realtime_ming.protocol.items import InputVideo
    from realtime_ming.sdk import RealtimeClient

    async with RealtimeClient.connect(spy.url) as client:
        await client.update_session(turn_detection=None, max_output_tokens=4)
        item_id = await client.add_video([_solid(20 * k) for k in range(8)], fps=4.0, text="What happens?")
        async for event in client:
            if getattr(event, "type", None) == "conversation.item.done":
                assert event.item.id == item_id
                assert event.item.content[0] == InputVideo(num_frames=8, duration_s=1.75)
                break
        await client.create_response(output_modalities="text")
        turn = await client.collect_turn()
    assert turn.status.value != "failed"
    assert spy.requests[-1].history[-1].content[0].video.shape[0] == 4
    with pytest.raises(ValueError):
        await client.add_video([_solid(0)])  # neither fps nor timestamps


async def test_example_video_turn_sends_a_clip_file_and_gets_a_spoken_reply(tmp_path, engine):
    """examples/video_turn.py --video clip.mp4: the file goes as a data:video URL and the answer is saved."""
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        clip = tmp_path / "clip.mp4"
        clip.write_bytes(_mp4([_solid(8 * k) for k in range(20)], 10))
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "examples" / "video_turn.py"), "--url", f"ws://127.0.0.1:{srv.port}/v1/realtime",
            "--video", str(clip), "--output", "answer.wav", cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), seconds(120))
    assert process.returncode == 0, err.decode()
    assert "sent video file clip.mp4" in out.decode() and "failed" not in out.decode(), out.decode()
    assert (tmp_path / "answer.wav").stat().st_size > 44


def test_video_url_without_pyav_names_the_missing_extra(monkeypatch):
    """No PyAV (the `video` extra): a data:video part gets `video_decoder_unavailable`, not a crash."""
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    with pytest.raises(Exception) as missing:
        decode_video_url("data:video/mp4;base64,AAAA", "item.content[0].video_url")
    assert missing.value.code == "video_decoder_unavailable" and missing.value.param == "item.content[0].video_url"
