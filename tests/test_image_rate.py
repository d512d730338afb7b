"""The per-session image rate bound (issue 19: camera frames "bounded in size and rate").

A token bucket on the session's own clock (`server.limits.max_images_per_s` sustained,
`max_image_burst` at once) counts every `input_image` part of `conversation.item.create` and of
`response.create` `input`. An event over it gets `image_rate_limited` (its event_id, the param of the
first image over) and nothing of it is applied; everything else goes on, and images are taken again
once the bucket refills. The Sans-I/O session is driven with explicit times; every frame it sends is
validated against the `openai` package's GA event types (session_support.Harness).
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from server_support import refused_then_answered, text_session
from session_support import Harness, last_error, refused_then_created, user_message

from realtime_ming.engine.api import ContentKind
from realtime_ming.protocol import parse
from realtime_ming.server import load_config
from realtime_ming.session import SessionSettings

pytestmark = pytest.mark.timeout(240)

T0 = 1000.0  # the session clock's time of the first event (any monotonic value)
CAMERA_JS = Path(__file__).resolve().parents[1] / "realtime_ming" / "web" / "js" / "camera.js"


def _image(shade: int) -> dict:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (shade, shade, shade)).save(buffer, format="PNG")
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}


def _shades(request) -> list[int]:
    return [int(c.image[0, 0, 0]) for m in request.history for c in m.content if c.kind is ContentKind.IMAGE]


def _harness():
    h = Harness()
    h.send_at(T0, type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                  "audio": {"input": {"turn_detection": None}}})
    return h, h.session.media


def test_a_burst_over_the_bound_refuses_exactly_the_excess():
    """burst + 3 one-image items at one instant: the first `burst` are stored and prompted in order, the
    3 others get `image_rate_limited` with their event_id and param and are not stored; a text item and a
    response go on meanwhile."""
    h, media = _harness()
    burst = media.max_image_burst
    results = [h.create_at(T0, f"evt_{k}", _image(10 + k)) for k in range(burst + 3)]
    assert results == ["added"] * burst + ["image_rate_limited"] * 3
    errors = [f for f in h.frames if f["type"] == "error"]
    assert [e["error"]["event_id"] for e in errors] == [f"evt_{k}" for k in range(burst, burst + 3)]
    assert {e["error"]["param"] for e in errors} == {"item.content[0]"}
    assert {e["error"]["type"] for e in errors} == {"invalid_request_error"}
    message = errors[0]["error"]["message"]
    assert f"{media.max_images_per_s:g} images per second" in message and f"up to {burst}" in message
    assert f"retry in {1 / media.max_images_per_s:.2f} s" in message, message
    assert len(h.session.conversation) == burst
    assert h.create_at(T0, "evt_text", {"type": "input_text", "text": "what do you see?"}) == "added"
    h.send_at(T0, type="response.create")
    (request,) = h.submitted()
    assert _shades(request) == [10 + k for k in range(burst)]
    assert request.history[-1].content[0].text == "what do you see?"


def test_images_are_taken_again_as_the_bucket_refills():
    """After the burst, one image per 1/rate seconds is taken (the next one in the same instant is not);
    after burst/rate seconds a whole burst is taken again. Times before the last one do not refill."""
    h, media = _harness()
    burst, period = media.max_image_burst, 1.0 / media.max_images_per_s
    assert [h.create_at(T0, f"a{k}", _image(1)) for k in range(burst)] == ["added"] * burst
    assert h.create_at(T0 + 0.5 * period, "early", _image(2)) == "image_rate_limited"
    assert h.create_at(T0 - 10.0, "past", _image(2)) == "image_rate_limited"  # the clock never runs back
    assert h.create_at(T0 + period, "one", _image(3)) == "added"
    assert h.create_at(T0 + period, "two", _image(4)) == "image_rate_limited"
    later = T0 + period + burst * period
    assert [h.create_at(later, f"b{k}", _image(5)) for k in range(burst + 1)] == ["added"] * burst + [
        "image_rate_limited"]
    assert len(h.session.conversation) == 2 * burst + 1


def test_a_message_counts_each_image_all_or_none():
    """A message takes one token per image at once, or none: with 2 left, 3 images are refused naming the
    third (`item.content[3]` after a text part) and nothing is stored; 2 images then pass. A message with
    more images than a burst can never pass and says so."""
    h, media = _harness()
    burst = media.max_image_burst
    assert [h.create_at(T0, f"a{k}", _image(1)) for k in range(burst - 2)] == ["added"] * (burst - 2)
    text = {"type": "input_text", "text": "three views"}
    assert h.create_at(T0, "three", text, _image(2), _image(3), _image(4)) == "image_rate_limited"
    assert last_error(h)["param"] == "item.content[3]"
    assert len(h.session.conversation) == burst - 2
    assert h.create_at(T0, "two", text, _image(2), _image(3)) == "added"
    far = T0 + 3600.0
    assert h.create_at(far, "many", *[_image(k) for k in range(burst + 1)]) == "image_rate_limited"
    error = last_error(h)
    assert error["param"] == f"item.content[{burst}]" and f"at most {burst} per event" in error["message"], error
    assert h.create_at(far, "full", *[_image(k) for k in range(burst)]) == "added"


def test_response_input_images_count_too():
    """`response.create` with inline `input` images takes from the same bucket: over it, the response is
    not created (no engine turn) and the error names the image; once refilled it runs with those images."""
    h, media = _harness()
    burst = media.max_image_burst
    assert [h.create_at(T0, f"a{k}", _image(1)) for k in range(burst)] == ["added"] * burst
    ask = {"input": [user_message({"type": "input_text", "text": "and this?"}, _image(77))]}
    request = refused_then_created(h, T0, T0 + 1.0 / media.max_images_per_s, ask, "image_rate_limited",
                                   "response.input[0].content[1]")
    assert _shades(request) == [77]


def test_the_refused_event_is_not_predecoded():
    """The server decodes media on threads all sessions share before the session handles the event; an
    event over the rate is not decoded there (a flood costs no decoding)."""
    h, media = _harness()
    events = [parse(json.dumps({"type": "conversation.item.create", "item": user_message(_image(k))}), h.dialect)
              for k in range(media.max_image_burst + 1)]
    for event in events[:-1]:
        h.session.predecode(event, T0)
        assert h.session._intake.predecoded, "an admitted image is decoded ahead"
        h._take(h.session.handle_client_event(event, T0))
    h.session.predecode(events[-1], T0)
    assert not h.session._intake.predecoded
    h._take(h.session.handle_client_event(events[-1], T0))
    assert last_error(h)["code"] == "image_rate_limited"


def _demo_camera_times(interval_s: float, silence_s: float, speech_s: list[float]) -> list[float]:
    """When the demo's camera sends frames (`CameraStreamer.resume`): one at each speech start, then one per
    interval while the user speaks; turns separated by the VAD's silence."""
    times, start = [], T0
    for length in speech_s:
        times += [start + k * interval_s for k in range(int(length // interval_s) + 1)]
        start += length + silence_s
    return times


def test_the_demo_camera_never_hits_the_default_bound():
    """The browser demo's camera rate (read from camera.js) over a minute of talk, long turns and quick
    short ones (each speech start sends a frame at once), never meets the default bound."""
    interval_ms = int(re.search(r"CAMERA_INTERVAL_MS = (\d+)", CAMERA_JS.read_text()).group(1))
    silence_s = SessionSettings().vad.detector.silence_duration_ms / 1000
    speech = [12.0, 0.3, 0.3, 0.3, 0.3, 7.5, 0.2] * 3 + [0.25] * 20
    times = _demo_camera_times(interval_ms / 1000, silence_s, speech)
    assert len(times) > 60
    h, _media = _harness()
    results = [h.create_at(t, f"f{k}", _image(k % 256)) for k, t in enumerate(times)]
    assert results == ["added"] * len(times)


def test_the_bound_is_server_config():
    """`server.limits.max_images_per_s` / `max_image_burst` are read from config and must be > 0."""
    limits = load_config(None, ["server.limits.max_images_per_s=0.5", "server.limits.max_image_burst=2"]).server.limits
    assert (limits.max_images_per_s, limits.max_image_burst) == (0.5, 2)
    for bad in ("server.limits.max_images_per_s=0", "server.limits.max_image_burst=0"):
        with pytest.raises(ValueError, match="must be > 0"):
            load_config(None, [bad])


async def test_over_the_socket_the_configured_bound_refuses_and_the_session_goes_on(engine):
    """A real server configured with a burst of 2 and a slow refill: on loopback the third image item gets
    `image_rate_limited` (valid GA error frame, the client's event_id), the first two are prompted and
    the reply comes; every frame validates against the openai GA types."""
    config = load_config(None, ["server.port=0", "server.limits.max_image_burst=2",
                                "server.limits.max_images_per_s=0.01", "session.max_output_tokens=2"])
    async with text_session(config, engine) as (client, recording):
        for k in range(2):
            await client.send(type="conversation.item.create", item=user_message(_image(50 + k)))
            await client.recv_until("conversation.item.done")
        await client.send(type="conversation.item.create", event_id="evt_third", item=user_message(_image(99)))
        await refused_then_answered(client, "image_rate_limited", "evt_third", "item.content[0]")
    assert _shades(recording.requests[-1]) == [50, 51]
