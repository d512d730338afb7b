"""The frame parser's size policy (server/frame_parser.py, issue 43): what it refuses without its child process,
what it parses there, and that a server starts the child before the first large frame arrives."""

from __future__ import annotations

import json

from realtime_ming.protocol import Dialect, ErrorCode, ProtocolError
from realtime_ming.protocol.client_events import InputAudioBufferAppend
from realtime_ming.server.frame_parser import FrameParser


async def test_control_frame_over_the_cap_never_reaches_the_child():
    """A session.update over the control cap that opens with its type is refused from its first characters (no
    child is started for it); a large media frame and a large frame whose type is not leading are parsed in the
    child, with the same answers as inline."""
    parser = FrameParser(control_max_bytes=4096, inline_chars=1024)
    try:
        update = json.dumps({"type": "session.update", "event_id": "u1", "session": {"instructions": "x" * 5000}})
        error = await parser.parse(update, Dialect.GA)
        assert isinstance(error, ProtocolError)
        assert (error.code, error.param, error.event_id) == (ErrorCode.EVENT_FRAME_TOO_LARGE, "type", "u1")
        assert not parser.running
        binary = await parser.parse(b"\x00" * 5000, Dialect.GA)  # refused at once as well
        assert isinstance(binary, ProtocolError) and binary.code is ErrorCode.BINARY_FRAME_UNSUPPORTED
        assert not parser.running
        trailing = json.dumps({"session": {"instructions": "x" * 5000}, "type": "session.update", "event_id": "u2"})
        error = await parser.parse(trailing, Dialect.GA)  # decoded (in the child) to find its type
        assert parser.running
        assert isinstance(error, ProtocolError)
        assert (error.code, error.param, error.event_id) == (ErrorCode.EVENT_FRAME_TOO_LARGE, "type", "u2")
        append = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 2000})
        event = await parser.parse(append, Dialect.GA)
        assert isinstance(event, InputAudioBufferAppend) and event.audio == "AAAA" * 2000
    finally:
        parser.close()
    assert not parser.running


async def test_a_dead_child_costs_one_frame():
    """The child killed: the frame it was to parse gets `server_error`, the next large frame a new child and its
    event; a bug in parse (in the child) fails only that frame."""
    parser = FrameParser(control_max_bytes=4096, inline_chars=1024)
    append = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 2000})
    try:
        parser.start()
        assert parser.running
        process = parser._child.process  # noqa: SLF001 -- the test kills the child
        process.kill()
        process.join(10)
        error = await parser.parse(append, Dialect.GA)
        assert isinstance(error, ProtocolError) and error.code is ErrorCode.SERVER_ERROR
        event = await parser.parse(append, Dialect.GA)
        assert isinstance(event, InputAudioBufferAppend) and parser.running
    finally:
        parser.close()
