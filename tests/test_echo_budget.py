"""Large images and the per-session outbound budget, end to end on loopback (real server, tiny engine, CPU).

GA documents `conversation.item.added` / `.done` as carrying the item's full content except audio and
`conversation.item.retrieved` as carrying all of it, so an `input_image` near the frame size is echoed
in full twice, and again on every retrieve. Those echoes must never end a session that stays within
its limits (they used to: 2 x 12 MiB queued > the 16 MiB outbound budget -> 1008 "client is not
reading"), while a client that really stops reading is still closed. Every frame received is
validated against the openai package's GA server-event union (`WsClient`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import struct
import zlib

import numpy as np
import pytest
from server_support import WsClient, seconds
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config

pytestmark = pytest.mark.timeout(180)

PREFIX = "data:image/png;base64,"


def _noise_png_url(url_bytes: int) -> str:
    """A photo-like (incompressible) PNG whose data URL is about `url_bytes` long."""
    from PIL import Image

    side = int((url_bytes * 3 / 4 / 3) ** 0.5)
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=0)
    return PREFIX + base64.b64encode(buffer.getvalue()).decode()


def _padded_png_url(url_bytes: int) -> str:
    """A valid 32x32 PNG made `url_bytes` long by a private ancillary chunk (cheap for the model to see)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(buffer, format="PNG")
    png = buffer.getvalue()
    pad = bytes(url_bytes * 3 // 4 - len(png))
    chunk = struct.pack(">I", len(pad)) + b"prVt" + pad + struct.pack(">I", zlib.crc32(b"prVt" + pad))
    return PREFIX + base64.b64encode(png[:33] + chunk + png[33:]).decode()


def _image_item(url: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}


async def _client(srv: RealtimeServer, max_queue: int = 16) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=ming", max_size=None, max_queue=max_queue)
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client


def _image_of(frame: dict) -> str:
    parts = frame["item"]["content"]
    assert [p["type"] for p in parts] == ["input_image"], parts
    return parts[0]["image_url"]


async def test_image_near_the_frame_size_is_echoed_and_retrieved(engine):
    """A ~12 MiB photo (3/4 of the outbound budget, within the frame size): added and done both carry
    it in full, two retrieves in a row return it, and the session stays open."""
    cfg = load_config(None, ["server.port=0"])
    limits = cfg.server.limits
    size = limits.max_outbound_bytes * 3 // 4
    assert size + 4096 < limits.max_frame_bytes  # the create frame itself is within the limits
    url = _noise_png_url(size)
    async with RealtimeServer(cfg, engine) as srv:
        client = await _client(srv)
        await client.send(type="conversation.item.create", item=_image_item(url))
        frames = await client.recv_until("conversation.item.done", timeout=60)
        assert [f["type"] for f in frames] == ["conversation.item.added", "conversation.item.done"]
        assert _image_of(frames[0]) == url and _image_of(frames[1]) == url
        item_id = frames[1]["item"]["id"]
        for _ in range(2):  # the two retrieves are queued together: 2 x 12 MiB waiting at once
            await client.send(type="conversation.item.retrieve", item_id=item_id)
        for _ in range(2):
            retrieved = await client.recv(timeout=30)
            assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"]["id"] == item_id
            assert _image_of(retrieved) == url
        await client.send(type="conversation.item.delete", item_id=item_id)
        assert (await client.recv())["type"] == "conversation.item.deleted"
        assert srv.num_sessions == 1
        await client.ws.close()


async def test_retrieve_during_a_spoken_response(engine):
    """A client retrieves a ~12 MiB image while a spoken response streams its audio: the retrieved frame
    goes out between the deltas, the response completes, the session stays open."""
    cfg = load_config(None, ["server.port=0"])
    url = _padded_png_url(cfg.server.limits.max_outbound_bytes * 3 // 4)
    async with RealtimeServer(cfg, engine) as srv:
        client = await _client(srv)
        await client.send(type="conversation.item.create", item=_image_item(url))
        item_id = (await client.recv_until("conversation.item.done", timeout=60))[-1]["item"]["id"]
        await client.send(type="response.create", response={"max_output_tokens": 4})
        await client.recv_until("response.created")
        await client.send(type="conversation.item.retrieve", item_id=item_id)
        frames = await client.recv_until("response.done", timeout=120)
        retrieved = [f for f in frames if f["type"] == "conversation.item.retrieved"]
        assert len(retrieved) == 1 and _image_of(retrieved[0]) == url
        assert frames[-1]["response"]["status"] in ("completed", "incomplete"), frames[-1]["response"]
        assert not [f for f in frames if f["type"] == "error"]
        await client.send(type="conversation.item.retrieve", item_id=item_id)  # still open, still stored
        assert _image_of(await client.recv(timeout=30)) == url
        await client.ws.close()


async def test_client_that_stops_reading_images_is_still_closed(engine, caplog):
    """A client that keeps creating images but reads nothing is closed with 1008 once the echoes waiting
    for it exceed what its conversation may hold (queued echoes share the stored strings)."""
    budget = 24 * 2**20
    cfg = load_config(None, ["server.port=0", f"server.limits.max_conversation_bytes={budget}",
                             "server.limits.close_timeout_s=1.0"])
    url = _padded_png_url(budget // 6)
    caplog.set_level(logging.INFO, logger="realtime_ming.server.connection")
    async with RealtimeServer(cfg, engine) as srv:
        client = await _client(srv, max_queue=1)
        # From here on the client reads nothing: its websockets buffer (max_queue=1) fills and TCP stops.
        frame = json.dumps({"type": "conversation.item.create", "item": _image_item(url)})
        for _ in range(40):
            if srv.num_sessions == 0:
                break
            try:
                await client.ws.send(frame)
            except ConnectionClosed:
                break
            await asyncio.sleep(0.05)
        async with asyncio.timeout(seconds(30)):
            while srv.num_sessions:
                await asyncio.sleep(0.05)
        assert "client is not reading" in caplog.text and "image bytes" in caplog.text
        client.ws.transport.abort()
