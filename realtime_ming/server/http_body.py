"""HTTP request bodies on the WebSocket server's port.

websockets parses the request head only and treats whatever follows as WebSocket frames, so a
POST body would be read as garbage frames and the connection dropped before any response.
`BodyConnection` (the base of the server's connection class, server/big_frames.py) takes the body off the byte stream
before websockets sees it: it watches the bytes up to the end of the head, and when the head
declares a body (`Content-Length`) it hands websockets the head alone and keeps the body for the
HTTP route (`await connection.request_body()`), with the `Content-Length` header removed (websockets
refuses a request that declares a body). websockets < 17 parses GET requests only: the request line
of another method reaches it as GET, and the route reads the real one from `http_method`. A body over `max_body_bytes` is never buffered
(the route answers 413); `Transfer-Encoding` (chunked) is not supported (411). After the head,
every byte goes straight to websockets: the realtime upgrade pays one branch per read.
`Expect: 100-continue` (curl, for large uploads) gets its interim response when the body fits.
A head that websockets' parser refuses (a control character in a header, a non-ASCII request line, no
HTTP version: it would close the connection without a word) is answered 400 `invalid_request` first.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import SecurityError
from websockets.http11 import Request
from websockets.streams import StreamReader

from .http import api_error

__all__ = ["BodyConnection", "BodyError", "FormPart", "form_parts"]

_HEAD_LIMIT = 64 * 1024  # past this without a blank line, websockets' own header limits answer


class BodyError(Exception):
    """The request body cannot be read: carries the HTTP status (411, 413, 400) and the text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _header_values(head: bytes, name: bytes) -> list[bytes]:
    values = []
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            values.append(value.strip())
    return values


class BodyConnection(ServerConnection):
    """A ServerConnection that keeps a declared request body away from the WebSocket parser."""

    def __init__(self, *args: Any, max_body_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_body = max_body_bytes
        self._head: bytearray | None = bytearray()  # None once the head has been handed over
        self._body: bytearray | None = None  # the body being received
        self._expected = 0
        self._discard = False  # a refused body: its bytes are dropped
        self._body_done: asyncio.Future[bytes] = self.loop.create_future()
        self._body_started: asyncio.Future[None] = self.loop.create_future()  # the first body byte (or the end)
        self.http_method = "GET"  # the request line's method (websockets may be shown GET instead)

    async def request_body(self) -> bytes:
        """The request's body (b"" when it declared none); raises BodyError."""
        return await asyncio.shield(self._body_done)

    async def body_started(self) -> None:
        """Return once the first byte of the body arrived, or the body ended (complete, empty or refused):
        a route can hold back a scarce slot from a client that sends a head and no body."""
        await asyncio.shield(self._body_started)

    def data_received(self, data: bytes) -> None:
        if self._head is None:
            if self._body is not None:
                self._take_body(data)
            elif not self._discard:
                self._frames_received(data)
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end == -1:
            if len(self._head) > _HEAD_LIMIT:
                self._pass_through(bytes(self._head))
            return
        head, rest = bytes(self._head[: end + 4]), bytes(self._head[end + 4 :])
        self._head = None
        method, sep, tail = head.partition(b" ")
        if sep and method not in (b"GET", b"HEAD") and method.isalpha() and len(method) <= 16:
            self.http_method = method.decode("ascii")
            head = b"GET " + tail
        elif sep and method.isalpha():
            self.http_method = method.decode("ascii")
        reason = _unparsable(_without_header(_without_header(head, b"transfer-encoding"), b"content-length"))
        if reason is not None:  # websockets would close without a response: answer first, then let it close
            self._refuse(BodyError(400, reason))
            response = api_error(400, "invalid_request", f"Malformed HTTP request: {reason}.")
            response.headers["Connection"] = "close"
            self.transport.write(response.serialize())
            super().data_received(head)
            return
        if _header_values(head, b"transfer-encoding"):
            self._refuse(BodyError(411, "Chunked request bodies are not supported: send Content-Length."))
            super().data_received(_without_header(head, b"transfer-encoding"))
            return
        lengths = _header_values(head, b"content-length")
        if not lengths:
            self._finish(b"")
            super().data_received(head)
            if rest:
                self._frames_received(rest)
            return
        if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            self._refuse(BodyError(400, "Invalid Content-Length header."))
        elif int(lengths[0]) > self._max_body:
            self._refuse(BodyError(413, f"The request body is over the limit of {self._max_body} bytes."))
        else:
            self._expected = int(lengths[0])
            self._body = bytearray()
            if any(v.lower() == b"100-continue" for v in _header_values(head, b"expect")) and self._expected:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        super().data_received(_without_header(head, b"content-length"))
        if self._body is not None:
            self._take_body(rest)

    def _frames_received(self, data: bytes) -> None:
        """The bytes after a body-less request head (the WebSocket frames of an upgrade): to websockets."""
        super().data_received(data)

    def _take_body(self, data: bytes) -> None:
        assert self._body is not None
        if data:
            self._start()
        need = self._expected - len(self._body)
        self._body += data[:need]
        if len(self._body) >= self._expected:
            body, self._body = bytes(self._body), None
            self._finish(body)
            self._discard = True  # nothing follows a body on this connection (one request each): dropped

    def _pass_through(self, data: bytes) -> None:
        self._head = None
        self._finish(b"")
        super().data_received(data)  # a head over the limit: websockets refuses it, nothing after it is framed

    def _finish(self, body: bytes) -> None:
        self._start()
        if not self._body_done.done():
            self._body_done.set_result(body)

    def _start(self) -> None:
        if not self._body_started.done():
            self._body_started.set_result(None)

    def _refuse(self, error: BodyError) -> None:
        self._discard = True
        self._start()
        if not self._body_done.done():
            self._body_done.set_exception(error)
            self._body_done.exception()  # retrieved: no "never retrieved" warning when no route reads it

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._body_done.done():
            self._refuse(BodyError(400, "The connection closed before the request body was complete."))
        super().connection_lost(exc)


def _unparsable(head: bytes) -> str | None:
    """Why websockets' request parser refuses this complete head, or None when it parses (or is refused for
    its size, which websockets answers itself: 414 / 431)."""
    reader = StreamReader()
    reader.feed_data(head)
    reader.feed_eof()
    try:
        next(Request.parse(reader.read_line))
    except (StopIteration, SecurityError):  # parsed; or over a size limit (RequestLineTooLong, HeaderLineTooLong...)
        return None
    except Exception as exc:  # noqa: BLE001 -- ValueError, UnicodeDecodeError, EOFError: all a malformed head
        return str(exc)[:200]
    return None  # not reached: the whole head is there, the parser never waits


def _without_header(head: bytes, name: bytes) -> bytes:
    lines = head.split(b"\r\n")
    kept = [lines[0]] + [line for line in lines[1:] if line.partition(b":")[0].strip().lower() != name]
    return b"\r\n".join(kept)


@dataclass(frozen=True, slots=True)
class FormPart:
    """One part of a multipart/form-data body."""

    name: str
    payload: bytes
    filename: str | None
    charset: str  # of a text field (utf-8 unless the part says otherwise)
    content_type: str

    def text(self) -> str:
        """The part as text; raises BodyError (400) when it does not decode."""
        try:
            return self.payload.decode(self.charset)
        except (UnicodeError, LookupError, ValueError):  # idna/punycode raise a bare UnicodeError
            raise BodyError(400, f"The form field {self.name!r} is not valid {self.charset[:40]!r} text.") from None


def form_parts(body: bytes, content_type: str) -> list[FormPart]:
    """The parts of a multipart/form-data body, in order; raises BodyError (400) for one that does not parse."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1", errors="replace") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise BodyError(400, "The multipart/form-data body could not be parsed (boundary missing or wrong).")
    parts = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise BodyError(400, "A multipart part has no form field name.")
        parts.append(FormPart(name, part.get_payload(decode=True) or b"", part.get_filename(),
                              part.get_content_charset() or "utf-8", part.get_content_type()))
    return parts
