"""Large text frames received beside websockets (server/big_frames.py, issue 43): the tracker's byte stream as
websockets' own parser reads it, whatever the reads' boundaries and the mask's phase; its refusals against the
frame parser's (`codec.parse`), a response.create without media among them; and on a served connection the order of
messages, a large media frame intact, a large session.update or media-less response.create refused with its event_id
(never reaching the parser's process), and websockets' own closes (1009, 1007) and pings."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import mmap
import os
import random

import pytest
from server_support import StubEngine, WsClient, pcm16_b64, seconds, tone
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from realtime_ming.engine.api import ContentKind
from realtime_ming.protocol import Dialect, ErrorCode, ProtocolError
from realtime_ming.protocol.codec import parse
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.server import big_frames
from realtime_ming.server.big_frames import BigFrameLimits, BigText, FrameConnection, FrameTracker, text_frame
from realtime_ming.server.frame_buffers import FrameBuffers
from realtime_ming.server.frame_parser import limits_parser

LIMITS = BigFrameLimits(threshold=1000, control_max_bytes=1500, max_frame_bytes=6000)
MAX_SIZE = 9000  # websockets' max_size for the unit tests


def _frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bytes | None = None) -> bytes:
    """One client frame (masked unless `mask` is b"")."""
    frame = Frame(Opcode(opcode), payload, fin=fin)
    raw = frame.serialize(mask=False, extensions=[]) if mask == b"" else _masked(frame, mask or os.urandom(4))
    return bytes([raw[0] | rsv]) + raw[1:]


def _masked(frame: Frame, mask: bytes) -> bytes:
    """`frame` serialized with the given mask key (websockets draws its own)."""
    raw = bytearray(frame.serialize(mask=False, extensions=[]))
    size = 2 + {126: 2, 127: 8}.get(raw[1] & 0x7F, 0)
    raw[1] |= 0x80
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(raw[size:]))
    return bytes(raw[:size]) + mask + payload


def _event(**event) -> bytes:
    return json.dumps(event, ensure_ascii=False).encode()


SMALL = _event(type="input_audio_buffer.clear", event_id="s1")
BIG_MEDIA = _event(type="conversation.item.create", event_id="m1", item={"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "é漢😀 " * 500}]})  # > threshold; multi-byte characters split by the reads
BIG_UPDATE = _event(type="session.update", event_id="u1", session={"instructions": "x" * 4000})  # refused: its type
WIDE_UPDATE = _event(type="session.update", session={"instructions": "漢" * 700})  # > threshold bytes, < cap chars
OVER_FRAME = _event(type="conversation.item.create", item={"text": "y" * 6500})  # over max_frame_bytes
TRAILING = _event(session={"instructions": "x" * 4000}, type="session.update")  # type not leading: kept, parsed


def _stream() -> tuple[bytes, list[tuple]]:
    """A client's frames and what the session should receive for each, in order."""
    parts = [
        (_frame(1, SMALL), ("text", SMALL)),
        (_frame(1, BIG_MEDIA), ("big", BIG_MEDIA)),
        (_frame(9, b"ping!"), ("ping", b"ping!")),
        (_frame(1, BIG_UPDATE), ("refused", ErrorCode.EVENT_FRAME_TOO_LARGE, "u1")),
        (_frame(1, SMALL), ("text", SMALL)),
        (_frame(1, BIG_MEDIA[:1200], fin=False), ("text-part", BIG_MEDIA[:1200])),  # fragmented: websockets'
        (_frame(9, b""), ("ping", b"")),
        (_frame(0, BIG_MEDIA[1200:]), ("cont", BIG_MEDIA[1200:])),
        (_frame(1, WIDE_UPDATE), ("big", WIDE_UPDATE)),
        (_frame(1, OVER_FRAME), ("refused", ErrorCode.FRAME_TOO_LARGE, None)),
        (_frame(2, b"\x00" * 1200), ("binary", b"\x00" * 1200)),
        (_frame(1, TRAILING), ("big", TRAILING)),
        (_frame(1, SMALL), ("text", SMALL)),
    ]
    return b"".join(raw for raw, _ in parts), [want for _, want in parts]


def _received(pieces: list[bytes], *, is_open: bool = True) -> tuple[list[tuple], ServerProtocol, FrameTracker]:
    """Feed `pieces` to a tracker, its output to websockets' own parser; what the session would receive."""
    protocol = ServerProtocol(state=State.OPEN if is_open else State.CONNECTING, max_size=MAX_SIZE)
    tracker = FrameTracker(LIMITS, protocol.receive_data, lambda: is_open, MAX_SIZE)
    for piece in pieces:
        tracker.feed(piece)
    seen: list[tuple] = []
    for frame in protocol.events_received():
        if frame.opcode is Opcode.TEXT and frame.fin:
            try:
                message = tracker.claim(frame.data.decode())
            except UnicodeDecodeError:  # websockets' recv closes the connection with 1007
                seen.append(("not utf-8", frame.data))
                continue
            if isinstance(message, BigText):
                seen.append(("big", bytes(message.data)) if message.refused is None
                            else ("refused", message.refused.code, message.refused.event_id))
            else:
                seen.append(("text", frame.data))
        else:
            kind = {Opcode.TEXT: "text-part", Opcode.CONT: "cont", Opcode.PING: "ping", Opcode.BINARY: "binary"}
            seen.append((kind[frame.opcode], frame.data))
    return seen, protocol, tracker


def _split(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, pos, k = [], 0, 0
    while pos < len(data):
        step = sizes[k % len(sizes)]
        pieces.append(data[pos:pos + step])
        pos, k = pos + step, k + 1
    return pieces


@pytest.mark.parametrize("sizes", [[1], [2], [3], [5, 7], [13, 4096], [1 << 20]])
def test_every_read_boundary_and_mask_phase(sizes):
    """Reads of 1, 2, 3, 5/7 bytes (every boundary of every header and payload, every mask phase) or large:
    websockets parses the same frames in the same order, the large ones taken and given back whole."""
    data, want = _stream()
    seen, protocol, tracker = _received(_split(data, sizes))
    assert seen == want
    assert protocol.state is State.OPEN and protocol.parser_exc is None
    assert tracker.taken == 5


def test_every_two_way_split_of_a_large_frame():
    """A large frame between two small ones, cut at every byte of its header, the start and end of its payload."""
    frames = [_frame(1, SMALL), _frame(1, BIG_MEDIA), _frame(1, SMALL)]
    data = b"".join(frames)
    start = len(frames[0])
    cuts = list(range(start - 2, start + 40)) + list(range(len(data) - len(frames[2]) - 8, len(data)))
    for cut in cuts:
        seen, _, _ = _received([data[:cut], data[cut:]])
        assert seen == [("text", SMALL), ("big", BIG_MEDIA), ("text", SMALL)], cut


def test_refusals_match_the_frame_parser():
    """A frame dropped as it arrives gets the error `codec.parse` gives the whole frame: code, param, message
    (its length in characters, not bytes), event_id."""
    for payload in (BIG_UPDATE, OVER_FRAME, _event(event_id="e9", type="session.update", session={"x": "é" * 3000})):
        seen, _, tracker = _received([_frame(1, payload)])
        text = payload.decode()
        expected = parse(text, Dialect.GA, control_max_bytes=LIMITS.control_max_bytes)
        if len(text) > LIMITS.max_frame_bytes:
            expected = ProtocolError(ErrorCode.FRAME_TOO_LARGE, num_bytes=len(text), max_bytes=LIMITS.max_frame_bytes)
        assert seen == [("refused", expected.code, expected.event_id)]
    big = _received([_frame(1, BIG_UPDATE)])
    assert big[0] == [("refused", ErrorCode.EVENT_FRAME_TOO_LARGE, "u1")]


def _create(event_id: str | None = None, *parts: dict, last_id: bool = False, **response) -> bytes:
    """A response.create of ~2,000 characters (over `LIMITS`' control cap) with these input parts."""
    body = {"conversation": "none", "instructions": "é漢 " * 500, **response}
    if parts:
        body["input"] = [{"type": "message", "role": "user", "content": list(parts)}]
    event = {"type": "response.create", "response": body}
    if event_id is not None:
        event = {"response": body, "event_id": event_id} if last_id else {"event_id": event_id, "response": body}
        event = {"type": "response.create", **event}
    return _event(**event)


PNG = "data:image/png;base64,iVBORw0KGgo="
CREATES = [
    _create("r1"),  # no media: refused as it arrives, its event_id echoed (leading or trailing, as clients write it)
    _create("r2", last_id=True, tools=[{"type": "function", "name": "f", "description": "audio image_url"}]),
    _create(None, {"type": "input_text", "text": "the audio"}, output_modalities=["audio"]),
    _create("r4", {"type": "input_audio", "audio": "AAAA" * 100}),  # media: kept for the parser
    _create("r5", {"type": "input_image", "image_url": PNG}),
    _create("r6", {"type": "input_video", "frames": [{"image_url": PNG, "timestamp_s": 0}]}),
    _create("r7", {"type": "input_image", "image_url": PNG}).replace(b'"image_url"', b'"image\\u005furl"'),
]


@pytest.mark.parametrize("sizes", [[1], [2], [3], [5, 7], [140, 141], [1 << 20]])
def test_a_response_create_without_media_is_refused_as_it_arrives(sizes):
    """A response.create over the control cap whose text shows no media key (however the reads cut its keys) is
    refused as it arrives with exactly what decoding it answers (`event_frame_too_large`, its event_id); one with
    audio, an image, a video or a key hidden by an escape is kept whole for the parser, which serves it."""
    for payload in CREATES:
        text = payload.decode()
        assert LIMITS.control_max_bytes < len(text) < LIMITS.max_frame_bytes
        seen, _, _ = _received(_split(_frame(1, payload), sizes))
        expected = parse(text, Dialect.GA, control_max_bytes=LIMITS.control_max_bytes)
        if isinstance(expected, ProtocolError) and expected.code is ErrorCode.EVENT_FRAME_TOO_LARGE:
            assert seen == [("refused", expected.code, expected.event_id)], text[-60:]
        else:
            assert not isinstance(expected, ProtocolError), expected
            assert seen == [("big", payload)], text[-60:]
    refused = [_received([_frame(1, payload)])[0][0] for payload in CREATES[:3]]
    assert refused == [("refused", ErrorCode.EVENT_FRAME_TOO_LARGE, event_id) for event_id in ("r1", "r2", None)]


def test_a_refused_frame_is_not_kept():
    """The payload of a refused frame is dropped while it arrives: the tracker holds no buffer for it."""
    data = _frame(1, BIG_UPDATE)
    protocol = ServerProtocol(state=State.OPEN, max_size=MAX_SIZE)
    tracker = FrameTracker(LIMITS, protocol.receive_data, lambda: True, MAX_SIZE)
    tracker.feed(data[:-100])
    assert tracker._receiving is not None and tracker._receiving.buffer is None  # noqa: SLF001 -- its state
    tracker.feed(data[-100:])
    message = tracker.claim(protocol.events_received()[0].data.decode())
    assert isinstance(message, BigText) and message.data is None and len(message) == len(BIG_UPDATE)


def test_a_refused_frames_buffer_serves_the_next_large_frame(monkeypatch):
    """A refused frame's buffer (pages already mapped) is reused by the next large frame; a smaller frame delivered
    from a larger reused buffer is exactly its own bytes (nothing an earlier frame left beyond them); what is kept
    stays under its bound, smallest fit first."""
    buffers = FrameBuffers(max_bytes=3 * len(OVER_FRAME))
    monkeypatch.setattr(big_frames, "frame_buffers", lambda: buffers)
    pieces = [_frame(1, OVER_FRAME), _frame(1, BIG_MEDIA), _frame(1, BIG_UPDATE), _frame(1, WIDE_UPDATE)]
    seen, _, _ = _received(pieces)
    assert seen == [("refused", ErrorCode.FRAME_TOO_LARGE, None), ("big", BIG_MEDIA),
                    ("refused", ErrorCode.EVENT_FRAME_TOO_LARGE, "u1"), ("big", WIDE_UPDATE)]
    assert buffers.reused == 2  # BIG_MEDIA in OVER_FRAME's buffer, WIDE_UPDATE in BIG_UPDATE's
    assert buffers.kept_bytes == 0  # both delivered frames kept theirs
    for size in (5000, 3000, 4000, 9000):
        buffers.give(mmap.mmap(-1, size))
    assert buffers.kept_bytes <= buffers.max_bytes and len(buffers.take(3500)) == 4000
    assert len(buffers.take(20000)) == 20000  # none fits: a new one


def test_what_websockets_refuses_still_reaches_it():
    """Over max_size (1009), unmasked (1002), RSV bits (1002), invalid UTF-8 (a frame websockets cannot decode,
    1007 when it is read): websockets sees each and fails the connection as it would have."""
    seen, protocol, _ = _received([_frame(1, b"z" * (MAX_SIZE + 1))])
    assert protocol.close_sent.code == CloseCode.MESSAGE_TOO_BIG
    for raw in (_frame(1, BIG_MEDIA, mask=b""), _frame(1, BIG_MEDIA, rsv=0x40)):
        seen, protocol, _ = _received([raw])
        assert protocol.close_sent.code == CloseCode.PROTOCOL_ERROR, raw[:2]
    cut = BIG_MEDIA[:BIG_MEDIA.rindex("😀".encode()) + 2]  # ends inside a character
    for payload in (b'{"a":"' + b"\xc3\x28" * 800 + b'"}', cut):
        seen, protocol, tracker = _received(_split(_frame(1, payload), [333]))
        assert [kind for kind, _ in seen] == ["not utf-8"] and tracker.taken == 1


def test_nothing_is_taken_before_the_handshake():
    """While the connection is not OPEN every byte goes to websockets as it came."""
    data, _ = _stream()
    forwarded = []
    tracker = FrameTracker(LIMITS, forwarded.append, lambda: False, MAX_SIZE)
    for piece in _split(data, [7, 333]):
        tracker.feed(piece)
    assert b"".join(forwarded) == data and tracker.taken == 0


def test_a_token_is_claimed_once_and_cannot_be_forged():
    """Only the token the tracker drew claims its frame, once; any other text (the prefix, a guess) is a message."""
    seen, protocol, tracker = _received([_frame(1, BIG_MEDIA)])
    assert seen == [("big", BIG_MEDIA)]
    data = _frame(1, BIG_MEDIA)
    forwarded = []
    tracker = FrameTracker(LIMITS, forwarded.append, lambda: True, MAX_SIZE)
    tracker.feed(data)
    token = ServerProtocol(state=State.OPEN)
    token.receive_data(b"".join(forwarded))
    text = token.events_received()[0].data.decode()
    for forged in (text[:-1] + ("0" if text[-1] != "0" else "1"), text[:25], "", text + " "):
        assert tracker.claim(forged) == forged
    assert isinstance(tracker.claim(text), BigText)
    assert tracker.claim(text) == text  # claimed already


def test_text_frame_is_what_websockets_parses():
    for size in (0, 125, 126, 65535, 65536):
        protocol = ServerProtocol(state=State.OPEN, max_size=None)
        payload = bytes(random.Random(size).randbytes(size))
        protocol.receive_data(text_frame(payload, b"\x01\x02\x03\x04"))
        (frame,) = protocol.events_received()
        assert (frame.opcode, frame.data, frame.fin) == (Opcode.TEXT, payload, True)


# ---- served ---------------------------------------------------------------------------------------------------


async def _served(*overrides: str):
    engine = StubEngine()
    srv = RealtimeServer(load_config(None, ["server.port=0", "session.vad.enabled=false", *overrides]), engine)
    await srv.start()
    return srv, engine


async def _client(srv: RealtimeServer) -> WsClient:
    ws = await connect(f"ws://127.0.0.1:{srv.port}/v1/realtime", max_size=None)
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client


def _connection(srv: RealtimeServer) -> FrameConnection:
    (conn,) = srv._server.connections  # noqa: SLF001 -- the test looks at what its connection's tracker took
    assert isinstance(conn, FrameConnection)
    return conn


def _item(item_id: str, text: str) -> dict:
    return {"type": "conversation.item.create", "event_id": f"e_{item_id}", "item": {
        "id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def test_small_big_small_in_order_and_intact():
    """Small, large media, large refused session.update, forged token, small: answered in the order sent; the
    large item's text arrives whole (multi-byte characters); the refusal names the update's event_id."""
    srv, engine = await _served("server.limits.max_control_frame_bytes=100000")
    try:
        client = await _client(srv)
        text = "é漢😀 wörds " * 9000  # ~100k characters, ~150 kB of UTF-8
        frames = [json.dumps(_item("item_a", "first")), json.dumps(_item("item_b", text), ensure_ascii=False),
                  json.dumps({"type": "session.update", "event_id": "u1", "session": {"instructions": "x" * 120_000}}),
                  "\x00realtime-ming big frame " + "0" * 32, json.dumps(_item("item_c", "last"))]
        for frame in frames:
            await client.ws.send(frame)
        order = []
        while "item_c" not in order:
            frame = await client.recv(timeout=30)
            if frame["type"] == "conversation.item.created" or frame["type"] == "conversation.item.added":
                order.append(frame["item"]["id"])
                if frame["item"]["id"] == "item_b":
                    assert frame["item"]["content"][0]["text"] == text
            elif frame["type"] == "error":
                order.append((frame["error"]["code"], frame["error"]["event_id"]))
        assert [entry for i, entry in enumerate(order) if entry not in order[:i]] == [
            "item_a", "item_b", ("event_frame_too_large", "u1"), ("invalid_json", None), "item_c"]
        assert _connection(srv).frames.taken == 2
        audio = pcm16_b64(tone(1.5))  # 96 kB of base64: a large media frame
        await client.send(type="input_audio_buffer.append", audio=audio)
        await client.send(type="input_audio_buffer.commit")
        await client.recv_until("input_audio_buffer.committed", timeout=30)
        assert _connection(srv).frames.taken == 3
        await client.ws.close()
    finally:
        await srv.close()
        engine.close()


async def test_pings_and_fragments_between_the_reads_of_a_large_frame():
    """A large frame written in pieces, a ping after it, a fragmented message with a ping between its frames:
    the pings are answered, both messages served in order."""
    srv, engine = await _served()
    try:
        client = await _client(srv)
        big = json.dumps(_item("item_big", "b" * 100_000)).encode()
        raw = text_frame(big, os.urandom(4))
        for k in range(0, len(raw), 9001):
            client.ws.transport.write(raw[k:k + 9001])
            await asyncio.sleep(0.005)
        await asyncio.wait_for(await client.ws.ping(b"p1"), seconds(10))
        parts = json.dumps(_item("item_frag", "f" * 90_000)).encode()
        client.ws.transport.write(_frame(1, parts[:70_000], fin=False))
        await asyncio.wait_for(await client.ws.ping(b"p2"), seconds(10))
        client.ws.transport.write(_frame(0, parts[70_000:]))
        created = []
        while len(created) < 2:
            frame = await client.recv(timeout=30)
            if frame["type"] == "conversation.item.added":
                created.append(frame["item"]["id"])
        assert created == ["item_big", "item_frag"]
        assert _connection(srv).frames.taken == 1  # the fragmented message went through websockets
        await client.ws.close()
    finally:
        await srv.close()
        engine.close()


@pytest.mark.parametrize(("payload", "code"), [
    ("z" * 200_000, CloseCode.MESSAGE_TOO_BIG),  # over max_message_bytes
    (b'{"type":"x","t":"' + b"\xff" * 100_000 + b'"}', CloseCode.INVALID_DATA),  # not UTF-8
], ids=["over-max-size", "not-utf-8"])
async def test_websockets_limits_close_the_connection(payload, code):
    """Over `max_message_bytes`: 1009; a large text frame that is not UTF-8: 1007, as websockets closes them."""
    srv, engine = await _served("server.limits.max_frame_bytes=100000", "server.limits.max_message_bytes=150000")
    try:
        client = await _client(srv)
        await client.ws.send(payload, text=True)
        with pytest.raises(ConnectionClosed) as info:
            while True:
                await client.recv(timeout=30)
        assert info.value.rcvd is not None and info.value.rcvd.code == code
    finally:
        await srv.close()
        engine.close()


def _png() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (40, 90, 200)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def test_a_media_less_response_create_never_reaches_the_parser(monkeypatch):
    """Over the control cap, a response.create without media is answered `event_frame_too_large` with its event_id
    (first or last key) without the frame parser's process seeing it; with an image, audio, or an image key written
    with an escape, it is parsed there and served (the engine gets the image / audio), the connection open."""
    srv, engine = await _served("server.limits.max_control_frame_bytes=100000")
    parser = limits_parser(srv.cfg.server.limits)
    parsed: list[int] = []
    real = parser._in_child  # noqa: SLF001 -- the test counts what reaches the child process
    monkeypatch.setattr(parser, "_in_child", lambda frame, dialect: parsed.append(len(frame)) or real(frame, dialect))
    try:
        client = await _client(srv)
        pad = "x" * 120_000  # over the 100,000 cap; within the instructions' own limit

        def create(*parts: dict) -> dict:
            items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what?"}, *parts]}]
            return {"conversation": "none", "instructions": pad, "input": items}

        await client.ws.send(json.dumps({"type": "response.create", "event_id": "r1", "response": create()}))
        await client.ws.send(json.dumps({"type": "response.create", "response": create(), "event_id": "r2"}))
        for event_id in ("r1", "r2"):
            error = await client.expect_error("event_frame_too_large", timeout=30)
            assert (error["param"], error["event_id"]) == ("type", event_id)
            assert "'response.create' frame of" in error["message"]
        assert parsed == [] and _connection(srv).frames.taken == 2
        image = {"type": "input_image", "image_url": _png()}
        audio = {"type": "input_audio", "audio": pcm16_b64(tone(0.5))}
        hidden = json.dumps({"type": "response.create", "response": create(image)}).replace(
            '"image_url"', '"image\\u005furl"')
        for frame, kind in [(json.dumps({"type": "response.create", "response": create(image)}), ContentKind.IMAGE),
                            (json.dumps({"type": "response.create", "response": create(audio)}), ContentKind.AUDIO),
                            (hidden, ContentKind.IMAGE)]:
            await client.ws.send(frame)
            frames = await client.recv_until("response.done", timeout=30)
            assert [f for f in frames if f["type"] == "error"] == [] and frames[-1]["response"]["status"] == "completed"
            request = engine.submitted[-1]
            assert kind in {part.kind for message in request.history for part in message.content}
        assert len(parsed) == 3 and _connection(srv).frames.taken == 5
        await client.ws.close()
    finally:
        await srv.close()
        engine.close()


class _Transport:
    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False


async def test_a_large_read_lets_the_loop_run_before_the_next():
    """After a read of at least the threshold the connection pauses reading until the loop's other ready callbacks
    ran, then resumes, unless websockets paused reading itself meanwhile (its queue full): then it stays paused."""
    conn = FrameConnection.__new__(FrameConnection)  # its reading only: no server, no handshake
    conn.loop, conn.transport, conn._yielding = asyncio.get_running_loop(), _Transport(), False
    conn.recv_messages = type("Queue", (), {"paused": False})()
    conn.frames = FrameTracker(LIMITS, lambda _data: None, lambda: True, MAX_SIZE)
    conn._frames_received(_frame(1, SMALL))  # a small read: nothing to wait for
    assert conn.transport.reading
    conn._frames_received(_frame(1, BIG_MEDIA))
    assert not conn.transport.reading
    await asyncio.sleep(0)
    assert conn.transport.reading
    conn._frames_received(_frame(1, BIG_MEDIA))
    conn.recv_messages.paused = True  # websockets' flow control: it resumes reading itself
    await asyncio.sleep(0)
    assert not conn.transport.reading
