"""No input poisons a conversation, long audio is windowed, memory is bounded in bytes.

End to end on loopback against the real engine (embedded tiny model, CPU): every input that used
to make each later response fail is either rejected at `conversation.item.create` with its own
code (nothing stored) or answered, and the next turn always works. A response that still fails
names its cause and leaves a working conversation. A client that stops reading is closed with
1008 before the server holds more than its outbound budget, promptly, even though it never
takes the closing handshake. An image bomb is refused from its header, without decoding.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from server_support import WsClient, pcm16_b64, seconds, tone
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.session.content import MediaLimits, decode_image_url

pytestmark = pytest.mark.timeout(240)

WIRE_RATE_HZ = 24000




def _png(width: int, height: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _bomb_png(side: int) -> str:
    """A black 1-bit PNG of side x side pixels, a few KB (built with zlib: Pillow takes seconds)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" * (1 + -(-side // 8))  # filter byte + packed bits
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * side, 9))
    return "data:image/png;base64," + base64.b64encode(png + chunk(b"IEND", b"")).decode()


def _audio(num_samples: int) -> str:
    return pcm16_b64(tone(num_samples / WIRE_RATE_HZ, WIRE_RATE_HZ))


def _user(*content: dict) -> dict:
    return {"type": "message", "role": "user", "content": list(content)}


async def _client(srv: RealtimeServer, max_queue: int = 16) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming", max_size=None, max_queue=max_queue)
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    await client.send(type="session.update", session={
        "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 2, "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": WIRE_RATE_HZ}, "turn_detection": None}}})
    await client.recv_until("session.updated")
    return client


async def _respond(client: WsClient, timeout: float = 60.0) -> dict:
    await client.send(type="response.create")
    frames = await client.recv_until("response.done", timeout)
    return frames[-1]["response"]


def _answered(response: dict) -> bool:
    # the tiny random model rarely emits its end token: max_output_tokens is a normal end here
    return response["status"] == "completed" or (
        response["status"] == "incomplete" and response["status_details"]["reason"] == "max_output_tokens")


_SAMPLES_10_MS = WIRE_RATE_HZ // 100
REJECTED = {
    "empty audio": (lambda: {"type": "input_audio", "audio": ""}, "input_audio_too_short"),
    "1-sample audio": (lambda: {"type": "input_audio", "audio": _audio(1)}, "input_audio_too_short"),
    "10 ms audio": (lambda: {"type": "input_audio", "audio": _audio(_SAMPLES_10_MS)}, "input_audio_too_short"),
    "1x1 png": (lambda: {"type": "input_image", "image_url": _png(1, 1)}, "image_too_small"),
    "31x31 png": (lambda: {"type": "input_image", "image_url": _png(31, 31)}, "image_too_small"),
    "32x6600 png (aspect 206)": (lambda: {"type": "input_image", "image_url": _png(32, 6600)},
                                 "image_aspect_ratio_too_large"),
    "11000x11000 png bomb": (lambda: {"type": "input_image", "image_url": _bomb_png(11000)}, "image_too_large"),
    # the protocol's per-field limit answers first (session.limits.max_item_text_chars can be lower)
    "1 MB of text": (lambda: {"type": "input_text", "text": "word " * 200_000}, "string_above_max_length"),
    "61 s of audio": (lambda: {"type": "input_audio", "audio": _audio(61 * WIRE_RATE_HZ)}, "input_audio_too_long"),
}


@pytest.mark.parametrize("case", list(REJECTED))
async def test_poisoned_input_is_rejected_at_create_and_the_next_turn_works(server, case):
    make_part, code = REJECTED[case]
    part = make_part()
    client = await _client(server)
    await client.send(type="conversation.item.create", event_id="evt_bad", item=_user(part))
    error = await client.expect_error(code, timeout=30)
    assert error["param"].startswith("item.content[0]") and error["event_id"] == "evt_bad", error
    await client.send(type="conversation.item.create", item=_user({"type": "input_text", "text": "hello"}))
    added = await client.recv_until("conversation.item.done")
    assert [f["type"] for f in added] == ["conversation.item.added", "conversation.item.done"]  # nothing else stored
    assert _answered(await _respond(client))
    assert _answered(await _respond(client))
    await client.ws.close()


ACCEPTED = {
    "32x32 png (smallest side)": lambda: {"type": "input_image", "image_url": _png(32, 32)},
    "32x6400 png (aspect 200)": lambda: {"type": "input_image", "image_url": _png(32, 6400)},
    "100 ms audio (the minimum)": lambda: {"type": "input_audio", "audio": _audio(WIRE_RATE_HZ // 10)},
    "35 s audio (over the encoder window)": lambda: {"type": "input_audio", "audio": _audio(35 * WIRE_RATE_HZ)},
}


@pytest.mark.parametrize("case", list(ACCEPTED))
async def test_edge_input_is_accepted_and_answered_twice(server, case):
    client = await _client(server)
    await client.send(type="conversation.item.create", item=_user(ACCEPTED[case]()))
    assert (await client.recv_until("conversation.item.done", 30))[0]["type"] == "conversation.item.added"
    assert _answered(await _respond(client))
    await client.send(type="conversation.item.create", item=_user({"type": "input_text", "text": "and now?"}))
    await client.recv_until("conversation.item.done")
    assert _answered(await _respond(client))
    await client.ws.close()


async def test_long_committed_turn_is_answered(server):
    """Audio longer than the encoder's window, committed as one user turn, is encoded in consecutive clips."""
    client = await _client(server)
    audio = tone(33.0, WIRE_RATE_HZ)
    for start in range(0, audio.size, WIRE_RATE_HZ):
        await client.send(type="input_audio_buffer.append", audio=pcm16_b64(audio[start:start + WIRE_RATE_HZ]))
    await client.send(type="input_audio_buffer.commit")
    await client.recv_until("conversation.item.done", 30)
    assert _answered(await _respond(client))
    assert _answered(await _respond(client))
    await client.ws.close()


async def test_over_long_prompt_fails_with_its_cause_and_the_conversation_recovers(server):
    """Text within the per-item limit but beyond the model's context: response.done names the cause,
    the turn's input item is removed (conversation.item.deleted) and the next response works."""
    client = await _client(server)
    await client.send(type="conversation.item.create", item=_user({"type": "input_text", "text": "hi " * 40_000}))
    item_id = (await client.recv_until("conversation.item.done"))[-1]["item"]["id"]
    await client.send(type="response.create")
    frames = await client.recv_until("conversation.item.deleted", 60)
    done = next(f for f in frames if f["type"] == "response.done")["response"]
    assert done["status"] == "failed"
    assert done["status_details"]["error"]["code"] == "context_length_exceeded"
    assert frames[-1]["item_id"] == item_id
    await client.send(type="conversation.item.create", item=_user({"type": "input_text", "text": "hello"}))
    await client.recv_until("conversation.item.done")
    assert _answered(await _respond(client))
    await client.ws.close()


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def test_non_reading_client_is_closed_within_its_byte_budget(engine, caplog):
    """200 retrieves of a ~3.8 MB item by a client that never reads: the server closes the session
    (1008, the close bounded even though the peer never answers it) and its RSS grows by less than
    the outbound budget plus slack, where a count-bounded queue held ~750 MB."""
    budget = 8 * 2**20
    cfg = load_config(None, ["server.port=0", f"server.limits.max_outbound_bytes={budget}",
                             "server.limits.close_timeout_s=1.0"])
    caplog.set_level(logging.INFO, logger="realtime_ming.server.connection")
    async with RealtimeServer(cfg, engine) as srv:
        client = await _client(srv, max_queue=1)
        await client.send(type="conversation.item.create", item=_user(
            {"type": "input_audio", "audio": _audio(59 * WIRE_RATE_HZ)}))
        item_id = (await client.recv_until("conversation.item.done", 30))[-1]["item"]["id"]
        # From here on the client reads nothing: its websockets buffer (max_queue=1) fills and TCP stops.
        baseline = peak = _rss_bytes()
        started = time.monotonic()
        for _ in range(200):
            if srv.num_sessions == 0:
                break
            await client.ws.send('{"type": "conversation.item.retrieve", "item_id": "%s"}' % item_id)
            peak = max(peak, _rss_bytes())
            await asyncio.sleep(0.005)
        async with asyncio.timeout(seconds(20)):
            while srv.num_sessions:
                peak = max(peak, _rss_bytes())
                await asyncio.sleep(0.02)
        closed_after = time.monotonic() - started
        assert peak - baseline < budget + 64 * 2**20, (peak - baseline) / 2**20
        assert closed_after < seconds(15)
        assert "client is not reading" in caplog.text
        client.ws.transport.abort()


def test_image_bomb_is_refused_from_its_header_without_decoding(monkeypatch):
    """A 15 KB PNG of 11000 x 11000 pixels: refused from its header — no pixel is decoded (Pillow's load is never
    called) and no 121 M-pixel buffer is allocated."""
    from PIL import ImageFile

    url = _bomb_png(11000)
    assert len(url) < 64 * 1024
    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.size) or real_load(self))
    tracemalloc.start()
    with pytest.raises(ProtocolError) as caught:
        decode_image_url(url, "item.content[0]", MediaLimits())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert caught.value.code.value == "image_too_large"
    assert "11000x11000" in caught.value.message
    assert loads == [] and peak < 4 * 2**20, (loads, peak)
    decode_image_url(_bomb_png(64), "item.content[0]", MediaLimits())  # the probe sees a decode when one happens
    assert loads and set(loads) == {(64, 64)}


@pytest.mark.parametrize("size", [(32, 32), (33, 47), (480, 640), (32, 6400), (5000, 4000)])
def test_image_grid_from_the_size_equals_the_preprocessed_grid(size):
    """History images are placed from their size alone: the grid must be the one preprocessing gives."""
    from realtime_ming.model.config import PreprocessorConfig
    from realtime_ming.model.image_processing import image_grid, preprocess_image

    cfg = PreprocessorConfig()
    pixels = np.zeros((*size, 3), dtype=np.uint8)
    assert image_grid(*size, cfg) == tuple(int(v) for v in preprocess_image(pixels, cfg).grid_thw)


def test_audio_clips_cover_the_audio_within_the_encoder_window(engine):
    """The window comes from n_ctx (conv stride 2, 10 ms hop); long audio splits into equal in-window clips."""
    bundle = engine.bundle
    shortest, longest = bundle.audio_clip_samples
    n_ctx = bundle.cfg.ming.audio_config.whisper_encoder_config.n_ctx
    assert longest == 2 * n_ctx * 160
    wave = np.arange(2 * longest + 7, dtype=np.float32)
    clips = bundle.audio_clips(wave)
    assert len(clips) == 3 and all(shortest <= c.size <= longest for c in clips)
    np.testing.assert_array_equal(np.concatenate(clips), wave)
    (padded,) = bundle.audio_clips(np.ones(3, dtype=np.float32))
    assert padded.size == shortest and padded[:3].tolist() == [1, 1, 1] and not padded[3:].any()
