"""Large client text frames received beside websockets, in pieces, so no one frame stalls the event loop.

websockets receives a message whole: its stream reader grows a buffer by each read (copying it again and again),
then slices, unmasks, joins and decodes the message, all at once on the event loop that also answers every other
session and /health. For a 9.4 MB frame (issue 43's tools attack) that is one stall of tens of milliseconds.

`FrameConnection` (the server's connection class, an `http_body.BodyConnection`) parses the header of each client
frame as the bytes arrive after the request head (`FrameTracker`). Everything it does not take is handed to
websockets byte for byte and untouched: control frames, binary frames, fragmented messages, frames with RSV bits,
unmasked or otherwise malformed frames (websockets fails the connection for them as it always did), frames over
websockets' `max_size` (1009), text frames up to `BigFrameLimits.threshold` bytes, and every frame while the
connection is not OPEN. A text frame over the threshold (the size the frame parser sends to its child process) is
taken instead: its payload goes into one buffer of its length (`mmap`: pages appear as they are written, nothing
is copied again; a refused frame's buffer is reused by the next, `frame_buffers`), unmasked and UTF-8 checked chunk by chunk, so each read costs the loop
work in proportion to the read, never to the frame; and after a large read the connection lets the loop's other
callbacks run before its next read (libuv reads a busy socket up to 32 times in a row: 8 MB, ~15 ms of this work
at once). A frame is dropped as it arrives (not kept) once its characters so far are over `max_frame_bytes`
(`frame_too_large`) or over the control-frame cap with a leading media-less `type` (`codec.refuse_by_leading_chars`,
the frame parser's own refusal: `event_frame_too_large`, its `event_id` echoed). A `response.create` over the cap
(which may carry media, but need not: issue 43's tools attack) is scanned for media as it arrives
(`media_scan.MediaScan`: regular expressions run by C code over each read and one match's length before it); when
complete, one whose text shows no media is refused the same way, never decoded by the parser's process.

When the frame is complete, websockets is handed a small masked text frame in its place: a token drawn at random
for this frame (`secrets`, 128 bits: no client can name a frame it did not send), so websockets' queue, its flow
control and the session's receive loop see every message in the order it was sent. `FrameConnection.claim` turns
that token back into a `BigText` (the payload's UTF-8 bytes and character count, or the refusal to answer), which
the frame parser sends to its child without decoding it here. A frame that is not valid UTF-8 is replaced by one
that is not either, so websockets closes the connection with 1007 when the session reads it, as it would have.
"""

from __future__ import annotations

import codecs
import functools
import mmap
import secrets
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.protocol import State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover -- websockets without its C extension
    from websockets.utils import apply_mask

from ..protocol.codec import LEADING_CHARS, TRAILING_CHARS, leading_type, refuse_by_leading_chars
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.limits import CAPPED_UNLESS_MEDIA_TYPES, MEDIA_EVENT_TYPES
from ..protocol.media_scan import MediaScan
from .frame_buffers import frame_buffers
from .http_body import BodyConnection

__all__ = ["BigFrameLimits", "BigText", "FrameConnection", "FrameTracker", "frame_connection_factory", "text_frame"]

_TOKEN_PREFIX = "\x00realtime-ming big frame "  # not JSON: a token that reaches the parser unclaimed is invalid_json
_LEADING_BYTES = 4 * LEADING_CHARS + 3  # enough UTF-8 bytes for LEADING_CHARS characters
_TRAILING_BYTES = 4 * TRAILING_CHARS + 3
_MAX_HEADER = 14  # 2 + 8 (64-bit length) + 4 (mask key)
_TEXT, _CONTINUATION, _BINARY = 0x1, 0x0, 0x2


@dataclass(frozen=True, slots=True)
class BigFrameLimits:
    """What the tracker takes and what it refuses while receiving (read from the server's limits and parser)."""

    threshold: int  # text frames with more payload bytes than this are taken (the frame parser's inline size)
    control_max_bytes: int  # an event without media over this many characters is refused by its leading type
    max_frame_bytes: int  # a frame over this many characters is refused (frame_too_large)


@dataclass(frozen=True, slots=True, eq=False)
class BigText:
    """A text message received by the tracker: its UTF-8 payload (`data`, None when it was dropped) and length in
    characters (`len()`, as a `str` message's), or `refused`, the error to answer for it."""

    data: mmap.mmap | memoryview | None
    chars: int
    refused: ProtocolError | None

    def __len__(self) -> int:
        return self.chars


def text_frame(payload: bytes, mask: bytes = b"\x00\x00\x00\x00") -> bytes:
    """One masked, final text frame (a client's framing) of `payload`."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | _TEXT, 0x80 | n)
    elif n < 2**16:
        head = struct.pack("!BBH", 0x80 | _TEXT, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | _TEXT, 0x80 | 127, n)
    return head + mask + apply_mask(payload, mask)


class _Receiving:
    """One large text frame being received: unmasked, checked and kept (or dropped) a chunk at a time."""

    def __init__(self, length: int, mask: bytes, limits: BigFrameLimits) -> None:
        self.length = length
        self.got = 0
        self.masks = [mask[k:] + mask[:k] for k in range(4)]  # the key as it lines up at each offset % 4
        self.limits = limits
        self.buffers = frame_buffers()
        self.buffer: mmap.mmap | None = self.buffers.take(length)  # only [:length] is ever written or read
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.chars = 0
        self.valid = True
        self.head: str | None = None  # the leading characters, once read
        self.tail = b""  # the last bytes so far (where an event_id may be)
        self.refusable = False  # the leading type names an event without media
        self.scan: MediaScan | None = None  # an event that may carry media, over the control cap: does it?

    @property
    def remaining(self) -> int:
        return self.length - self.got

    def take(self, chunk: memoryview) -> None:
        plain = apply_mask(chunk, self.masks[self.got % 4])
        start, self.got = self.got, self.got + len(plain)
        self.tail = (self.tail + plain[-_TRAILING_BYTES:])[-_TRAILING_BYTES:]
        if self.valid:
            if plain.isascii() and not self.decoder.getstate()[0]:  # JSON as most clients write it: no str built
                self.chars += len(plain)
            else:
                try:
                    self.chars += len(self.decoder.decode(plain, self.got == self.length))
                except UnicodeDecodeError:
                    self.valid = False
                    self._drop()
        if self.buffer is not None:
            self.buffer[start:self.got] = plain
            self._judge()

    def _judge(self) -> None:
        """Drop the payload once its fate is known: over the frame cap, or an event of a type without media over the
        control cap; scan a media type's frame that may be over the cap for media (`MediaScan`: O(read) work)."""
        assert self.buffer is not None
        if self.head is None and (self.got >= _LEADING_BYTES or self.got == self.length):
            self.head = self.buffer[:_LEADING_BYTES].decode("utf-8", "ignore")
            event_type = leading_type(self.head)
            self.refusable = event_type is not None and event_type not in MEDIA_EVENT_TYPES
            if event_type in CAPPED_UNLESS_MEDIA_TYPES and self.length > self.limits.control_max_bytes:
                self.scan = MediaScan()  # (a frame of no more bytes than the cap has no more characters either)
        if self.chars > self.limits.max_frame_bytes or (self.refusable and self.chars > self.limits.control_max_bytes):
            self._drop()
        elif self.scan is not None:
            self.scan.feed(self.buffer, self.got)

    def result(self) -> BigText | None:
        """The complete frame as a message (None: not valid UTF-8)."""
        if not self.valid:
            return None
        limits = self.limits
        if self.chars > limits.max_frame_bytes:
            self._drop()
            refused = ProtocolError(ErrorCode.FRAME_TOO_LARGE, num_bytes=self.chars, max_bytes=limits.max_frame_bytes)
            return BigText(None, self.chars, refused)
        media_less = self.scan is not None and not self.scan.found
        if self.head is not None and (self.refusable or media_less):
            refused = refuse_by_leading_chars(self.head, self.chars, limits.control_max_bytes,
                                              tail=self.tail.decode("utf-8", "ignore"), media_less=media_less)
            if refused is not None:
                self._drop()
                return BigText(None, self.chars, refused)
        data = self.buffer
        if data is not None and len(data) != self.length:  # a reused, larger buffer: its first `length` bytes
            data = memoryview(data)[:self.length]
        return BigText(data, self.chars, None)

    def _drop(self) -> None:
        """The frame is not kept: its buffer goes back for the next large frame (nothing else holds it)."""
        if self.buffer is not None:
            self.buffers.give(self.buffer)
            self.buffer = None


class FrameTracker:
    """The client's byte stream after the request head, frame by frame: `feed` hands `forward` what websockets
    receives (in order), keeping large text frames back as `BigText` messages for `claim`."""

    def __init__(self, limits: BigFrameLimits, forward: Callable[[bytes], None], is_open: Callable[[], bool],
                 max_size: int | None) -> None:
        self.limits = limits
        self._forward = forward
        self._is_open = is_open
        self._max_size = max_size  # websockets' limit on an unfragmented message (it answers 1009 above)
        self._held = b""  # the start of a frame header, held until the header is whole
        self._skip = 0  # payload bytes of a frame websockets receives, still to come
        self._receiving: _Receiving | None = None
        self._fragmented = False  # a fragmented message is in progress (its frames all go to websockets)
        self._received: deque[tuple[str, BigText]] = deque()  # token -> message, in websockets' queue order
        self.taken = 0  # large frames received here (tests, diagnostics)

    def feed(self, data: bytes) -> None:
        """Take the next bytes from the client."""
        view = memoryview(data)
        pos = start = 0  # data[start:pos] is websockets', not forwarded yet
        n = len(data)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
            elif self._receiving is not None:
                receiving = self._receiving
                step = min(receiving.remaining, n - pos)
                receiving.take(view[pos:pos + step])
                pos = start = pos + step
                if not receiving.remaining:
                    self._receiving = None
                    self._complete(receiving)
            else:
                header = self._held + bytes(view[pos:pos + _MAX_HEADER - len(self._held)])
                parsed = _parse_header(header)
                if parsed is None:  # the header continues in the next read
                    self._flush(data, start, pos)
                    self._held, start, pos = header, n, n
                    continue
                size, fin, rsv, opcode, length, mask = parsed
                used = size - len(self._held)
                if self._takes(fin, rsv, opcode, length, mask):
                    self._flush(data, start, pos)
                    assert mask is not None
                    self._receiving = _Receiving(length, mask, self.limits)
                    self.taken += 1
                    start = pos + used
                else:
                    if self._held:  # the header's first bytes came in an earlier read: they go first
                        self._forward(self._held)
                    self._skip = length
                    self._track_fragments(fin, opcode)
                self._held = b""
                pos += used
        self._flush(data, start, pos)

    def flush(self) -> None:
        """Hand websockets a header held back (the stream ends: websockets reports the truncated frame)."""
        if self._held:
            held, self._held = self._held, b""
            self._forward(held)

    def claim(self, message: str | bytes) -> str | bytes | BigText:
        """The message websockets delivered, or the large frame its token stands for."""
        if self._received and isinstance(message, str) and message == self._received[0][0]:
            return self._received.popleft()[1]
        return message

    def _takes(self, fin: bool, rsv: int, opcode: int, length: int, mask: bytes | None) -> bool:
        return (fin and not rsv and opcode == _TEXT and mask is not None and not self._fragmented
                and length > self.limits.threshold and (self._max_size is None or length <= self._max_size)
                and self._is_open())

    def _track_fragments(self, fin: bool, opcode: int) -> None:
        if opcode in (_TEXT, _BINARY):
            self._fragmented = not fin
        elif opcode == _CONTINUATION and fin:
            self._fragmented = False

    def _complete(self, receiving: _Receiving) -> None:
        message = receiving.result()
        if message is None:  # invalid UTF-8: websockets answers it (1007) when the session reads it
            self._forward(text_frame(b"\xff"))
            return
        token = _TOKEN_PREFIX + secrets.token_hex(16)
        self._received.append((token, message))
        self._forward(text_frame(token.encode()))

    def _flush(self, data: bytes, start: int, end: int) -> None:
        if end > start:
            self._forward(data if start == 0 and end == len(data) else data[start:end])


def _parse_header(header: bytes) -> tuple[int, bool, int, int, int, bytes | None] | None:
    """(header size, FIN, RSV bits, opcode, payload length, mask key or None) of a whole header, else None."""
    if len(header) < 2:
        return None
    b0, b1 = header[0], header[1]
    code = b1 & 0x7F
    size = 2 + (2 if code == 126 else 8 if code == 127 else 0)
    masked = bool(b1 & 0x80)
    if len(header) < size + 4 * masked:
        return None
    length = code if code < 126 else int.from_bytes(header[2:size], "big")
    mask = header[size:size + 4] if masked else None
    return size + 4 * masked, bool(b0 & 0x80), b0 & 0x70, b0 & 0x0F, length, mask


class FrameConnection(BodyConnection):
    """The server's connection: a `BodyConnection` whose WebSocket frames pass through a `FrameTracker`."""

    def __init__(self, *args: Any, frame_limits: BigFrameLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        protocol = self.protocol
        sizes = [s for s in (protocol.max_message_size, protocol.max_fragment_size) if s is not None]
        self.frames = FrameTracker(frame_limits, super()._frames_received, lambda: protocol.state is State.OPEN,
                                   min(sizes) if sizes else None)
        self._yielding = False  # reading paused until the loop's other ready callbacks ran

    def _frames_received(self, data: bytes) -> None:
        self.frames.feed(data)
        if len(data) >= self.frames.limits.threshold and not self._yielding:
            # a large read: the next one waits for the loop's other callbacks (libuv reads up to 32 times in a row)
            self._yielding = True
            self.transport.pause_reading()
            self.loop.call_soon(self._resume_reading)

    def _resume_reading(self) -> None:
        self._yielding = False
        if not self.recv_messages.paused and not self.transport.is_closing():  # websockets' own flow control first
            self.transport.resume_reading()

    def claim(self, message: str | bytes) -> str | bytes | BigText:
        """`FrameTracker.claim` (the session's receive loop calls it on every message)."""
        return self.frames.claim(message)

    def eof_received(self) -> None:
        self.frames.flush()
        super().eof_received()


def frame_connection_factory(max_body_bytes: int, frame_limits: BigFrameLimits):
    """The `create_connection` argument of `serve()`: FrameConnections with this body limit and these frame limits."""
    return functools.partial(FrameConnection, max_body_bytes=max_body_bytes, frame_limits=frame_limits)
