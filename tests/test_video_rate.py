"""The per-session video rate bound (issue 19: short video clips "bounded in size and rate").

A token bucket of video seconds on the session's own clock (`server.limits.max_video_s_per_s` sustained,
`max_video_s` at once, so one longest clip fits a full bucket) counts every `input_video` clip of
`conversation.item.create` and of `response.create` `input` by its span, first to last frame (at least
one sampling period). An event over it gets `video_rate_limited` (its event_id, the param of the clip
over) and nothing of it is applied; everything else goes on, and clips are taken again once the bucket
refills. A `data:video` clip's span comes from the container probe (demux only), before any frame is
decoded; the decode reuses that probe. The Sans-I/O session is driven with explicit times; every frame
it sends is validated against the `openai` package's GA event types (session_support.Harness).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from server_support import refused_then_answered, text_session
from session_support import Harness, last_error, refused_then_created, user_message
from media_support import _jpeg, _mp4, _solid

from realtime_ming.engine.api import ContentKind
from realtime_ming.protocol import parse
from realtime_ming.server import load_config
from realtime_ming.session import video_container
from realtime_ming.session.content import MediaLimits

pytestmark = pytest.mark.timeout(240)

T0 = 1000.0  # the session clock's time of the first event (any monotonic value)
LIMITS = MediaLimits(max_video_s=4.0, max_video_s_per_s=1.0)  # small clips keep the decode cheap
TEXT = {"type": "input_text", "text": "what happens?"}


def _clip(span_s: float, shade: int = 0, count: int = 2) -> dict:
    """A frames clip of `count` tiny frames from 0 to `span_s` (the first frame's grey level is `shade`)."""
    stamps = np.linspace(0.0, span_s, count) if count > 1 else [0.0]
    return {"type": "input_video",
            "frames": [{"image_url": _jpeg(_solid(shade + k)), "timestamp_s": float(t)} for k, t in enumerate(stamps)]}


def _image(shade: int) -> dict:
    return {"type": "input_image", "image_url": _jpeg(_solid(shade))}


def _harness(limits: MediaLimits = LIMITS) -> Harness:
    h = Harness(media=limits)
    h.send_at(T0, type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                   "audio": {"input": {"turn_detection": None}}})
    return h


def _videos(request) -> list:
    return [c for m in request.history for c in m.content if c.kind is ContentKind.VIDEO]


def test_a_second_clip_over_the_burst_is_refused_until_the_bucket_refills():
    """Two clips at one instant whose spans exceed the burst: the first is stored, the second gets
    `video_rate_limited` (event_id, the clip's param, the rate, the burst and the wait in its message) and
    is not stored; a text item goes on meanwhile. Just before the wait it is refused again, at the wait it
    is stored, and the reply's prompt holds both clips in order."""
    h = _harness()
    span = 0.75 * LIMITS.max_video_s
    assert 2 * span > LIMITS.max_video_s
    assert h.create_at(T0, "evt_a", _clip(span, shade=10)) == "added"
    assert h.create_at(T0, "evt_b", TEXT, _clip(span, shade=200)) == "video_rate_limited"
    error = last_error(h)
    assert (error["event_id"], error["param"], error["type"]) == ("evt_b", "item.content[1]", "invalid_request_error")
    wait_s = (span - (LIMITS.max_video_s - span)) / LIMITS.max_video_s_per_s
    message = error["message"]
    assert f"{LIMITS.max_video_s_per_s:g} s of video per second" in message, message
    assert f"up to {LIMITS.max_video_s:g} s" in message and f"retry in {wait_s:.2f} s" in message, message
    assert len(h.session.conversation) == 1
    assert h.create_at(T0, "evt_text", TEXT) == "added"
    assert h.create_at(T0 + wait_s - 0.05, "evt_early", _clip(span, shade=200)) == "video_rate_limited"
    assert h.create_at(T0 + wait_s, "evt_again", _clip(span, shade=200)) == "added"
    h.send_at(T0 + wait_s, type="response.create")
    (request,) = h.submitted()
    assert [int(v.video[0, 0, 0, 0]) for v in _videos(request)] == [10, 200]


def test_response_input_clips_take_from_the_same_bucket():
    """`response.create` with an inline clip over the bound creates no response (no engine turn) and names
    the clip; once the bucket refills the same request runs with that clip."""
    h = _harness()
    assert h.create_at(T0, "evt_a", _clip(LIMITS.max_video_s)) == "added"
    ask = {"input": [user_message(TEXT, _clip(1.0, shade=77))]}
    request = refused_then_created(h, T0, T0 + 1.0 / LIMITS.max_video_s_per_s, ask, "video_rate_limited",
                                   "response.input[0].content[1]")
    assert [int(v.video[0, 0, 0, 0]) for v in _videos(request)] == [77]


def test_an_event_takes_its_images_and_seconds_all_or_none():
    """An event with an image and a clip over the video bound is refused whole: its image takes no token (a
    full burst of images passes after it). Clips of one event count together: two that fit one by one but
    not together are refused naming the second, with the burst in the message."""
    h = _harness()
    assert h.create_at(T0, "evt_a", _clip(LIMITS.max_video_s)) == "added"
    assert h.create_at(T0, "evt_mixed", _image(1), _clip(1.0)) == "video_rate_limited"
    assert last_error(h)["param"] == "item.content[1]"
    burst = LIMITS.max_image_burst
    assert h.create_at(T0, "evt_images", *[_image(k) for k in range(burst)]) == "added"
    far = T0 + 3600.0
    half = 0.6 * LIMITS.max_video_s
    assert h.create_at(far, "evt_two", _clip(half), _clip(half)) == "video_rate_limited"
    error = last_error(h)
    assert error["param"] == "item.content[1]" and f"at most {LIMITS.max_video_s:g} s per event" in error["message"]
    assert h.create_at(far, "evt_one", _clip(half)) == "added"


def test_one_frame_clips_take_a_sampling_period_each():
    """A one-frame clip spans 0 s but is a frame to encode: it takes one sampling period (1 / the model's fps),
    so a flood of them is bounded too: a full bucket holds burst x fps of them."""
    h = _harness()
    period = 1.0 / LIMITS.video_sampling.fps
    fits = int(LIMITS.max_video_s / period + 1e-9)
    results = [h.create_at(T0, f"f{k}", _clip(0.0, shade=k, count=1)) for k in range(fits + 1)]
    assert results == ["added"] * fits + ["video_rate_limited"]
    assert f"retry in {period / LIMITS.max_video_s_per_s:.2f} s" in last_error(h)["message"]


def test_a_container_clip_is_probed_once_and_a_refused_one_never_decoded(monkeypatch):
    """A `data:video` clip's span comes from the container probe (demux only) on the decoder thread's
    `predecode`; an admitted clip is decoded from that probe (not probed again), a clip over the bound is
    refused without a frame decoded."""
    calls = {"probe": 0, "decode": 0}
    probe, decode = video_container.probe, video_container.decode_frames

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(video_container, "probe", counted("probe", probe))
    monkeypatch.setattr(video_container, "decode_frames", counted("decode", decode))
    url = "data:video/mp4;base64," + base64.b64encode(_mp4([_solid(8 * k) for k in range(12)], 4)).decode()
    span = video_container.probe(base64.b64decode(url.split(",", 1)[1]), "p", max_pixels=10**8, max_s=60).timestamps_s
    calls["probe"] = 0
    limits = MediaLimits(max_video_s=1.5 * (span[-1] - span[0]), max_video_s_per_s=0.5)
    h = _harness(limits)
    event = {"type": "conversation.item.create", "item": user_message({"type": "input_video", "video_url": url})}
    first, second = (parse(json.dumps(dict(event, event_id=e)), h.dialect) for e in ("evt_a", "evt_b"))
    h.session.predecode(first, T0)
    assert calls == {"probe": 1, "decode": 1}
    h._take(h.session.handle_client_event(first, T0))
    assert h.types()[-1] == "conversation.item.done" and calls == {"probe": 1, "decode": 1}
    h.session.predecode(second, T0)
    h._take(h.session.handle_client_event(second, T0))
    assert calls == {"probe": 2, "decode": 1}
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == ("video_rate_limited", "item.content[0]", "evt_b")


@pytest.mark.parametrize("decoded_ahead", [True, False])
def test_an_event_refused_for_another_reason_has_spent_its_seconds(decoded_ahead):
    """The rates are taken before anything else of the event is checked, as the server takes them before it
    decodes the media ahead (`predecode`): a clip in an item refused for its `previous_item_id` has spent its
    seconds (a flood of such items would otherwise be decoded for free), with or without the decode ahead."""
    h = _harness()
    event = parse(json.dumps({"type": "conversation.item.create", "previous_item_id": "item_missing",
                              "item": user_message(_clip(LIMITS.max_video_s))}), h.dialect)
    if decoded_ahead:
        h.session.predecode(event, T0)
        assert h.session._intake.predecoded
    h._take(h.session.handle_client_event(event, T0))
    assert last_error(h)["code"] == "item_create_invalid_previous_item_id"
    assert h.create_at(T0, "evt_next", _clip(1.0)) == "video_rate_limited"


def test_a_transcription_session_decodes_no_response_media():
    """`response.create` in a transcription session is refused outright: its clips are not decoded ahead and
    take nothing."""
    h = _harness()
    h.send_at(T0, type="session.update", session={"type": "transcription"})
    event = parse(json.dumps({"type": "response.create", "response": {
        "input": [user_message(_clip(LIMITS.max_video_s))]}}), h.dialect)
    h.session.predecode(event, T0)
    assert not h.session._intake.predecoded
    h._take(h.session.handle_client_event(event, T0))
    assert last_error(h)["code"] == "transcription_session_no_response"
    assert h.create_at(T0, "evt_clip", _clip(LIMITS.max_video_s)) == "added"


def test_the_bound_is_server_config():
    """`server.limits.max_video_s_per_s` is read from config (default 1.0: real time on average) and must be > 0."""
    assert load_config(None).server.limits.max_video_s_per_s == 1.0
    assert load_config(None, ["server.limits.max_video_s_per_s=0.25"]).server.limits.max_video_s_per_s == 0.25
    for bad in ("0", "-1"):
        with pytest.raises(ValueError, match="must be > 0"):
            load_config(None, [f"server.limits.max_video_s_per_s={bad}"])


async def test_over_the_socket_the_configured_bound_refuses_and_the_session_goes_on(engine):
    """A real server configured with a 2 s burst and a slow refill: on loopback the second clip gets
    `video_rate_limited` (valid GA error frame, the client's event_id, the clip's param), the first is
    prompted and the reply comes; every frame validates against the openai GA types."""
    config = load_config(None, ["server.port=0", "server.limits.max_video_s=2",
                                "server.limits.max_video_s_per_s=0.01", "session.max_output_tokens=2"])
    async with text_session(config, engine) as (client, recording):
        await client.send(type="conversation.item.create", item=user_message(_clip(1.5, shade=40)))
        await client.recv_until("conversation.item.done")
        await client.send(type="conversation.item.create", event_id="evt_second", item=user_message(_clip(1.5)))
        await refused_then_answered(client, "video_rate_limited", "evt_second", "item.content[0]")
    assert [int(v.video[0, 0, 0, 0]) for v in _videos(recording.requests[-1])] == [40]


@pytest.mark.parametrize("predecoded", [True, False])
def test_clip_is_echoed_as_the_client_sent_it(predecoded):
    """3 frames over 1.0 s are echoed as 3 frames / 1.0 s (the model still samples its own 2 fps frames), in
    `conversation.item.added` / `.done` and `retrieve` alike, whether the server decoded it ahead or not."""
    h = _harness()
    event = parse(json.dumps({"type": "conversation.item.create", "item": user_message(_clip(1.0, count=3), TEXT)}),
                  h.dialect)
    if predecoded:
        h.session.predecode(event, T0)
    h._take(h.session.handle_client_event(event, T0))
    summary = {"type": "input_image", "video": {"num_frames": 3, "duration_s": 1.0}}
    assert h.last("conversation.item.added")["item"]["content"][0] == summary
    assert h.last("conversation.item.done")["item"]["content"][0] == summary
    h.send_at(T0, type="conversation.item.retrieve", item_id=h.last("conversation.item.done")["item"]["id"])
    assert h.last("conversation.item.retrieved")["item"]["content"][0] == summary
    h.send_at(T0 + 1, type="response.create")
    (video,) = _videos(h.submitted()[-1])
    assert video.video.shape[0] == 4  # Ming's sampling: at least 4 frames, at 2 fps
