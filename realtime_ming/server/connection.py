"""One `/v1/realtime` connection: reader, session and writer tasks in one TaskGroup, over any `Transport`.

The reader parses frames into client events (oversize frames become `frame_too_large` errors, large ones are parsed
in another process: `frame_parser`),
the session task runs the `SessionRunner`, the writer sends serialised events with a send
timeout. A clean end (client gone, idle timeout, slow client) is raised by the task that saw it
as `SessionEnded`; the handler then closes with that code and frees the engine turn.

Memory: what waits to be sent is bounded in bytes (`max_outbound_bytes`, the frame being sent
included) and in frames; a client that lets more pile up is not reading and is closed with 1008.
Echoes of stored items (`conversation.item.added` / `.done` / `.retrieved`) are queued as events and
serialised only when their turn to be sent comes: the client's image data URLs they carry are the very
strings the conversation stores, so a queued echo holds no copy of them. Those shared bytes are bounded
apart (by `max_conversation_bytes`, what the conversation itself may hold), the rest of the echo (audio
encoded for a retrieve, text) counts against `max_outbound_bytes` like any frame: an image up to the
frame size is echoed twice and retrieved without the session ever exceeding its budget, while a client
that stops reading is still closed.
The close itself is bounded (`close_timeout_s`): a peer that never reads cannot take the closing
handshake, so its TCP connection is then aborted and the session's memory freed at once.

Transport-neutral: the WebSocket server and the WebRTC calls (`realtime_ming/rtc`) both run their sessions
here. A transport with media of its own passes a `MediaPath` (WebRTC: the audio tracks): it runs beside
the reader and writer, sees every server event before it is sent (audio deltas go to its track instead,
`output_audio_buffer.*` come from its playout) and may take client events (`output_audio_buffer.clear`).
A session opened with an ephemeral key starts with the config it was minted with (`initial`).

At the server's drain deadline (`LiveSessions.end_all`), each session ends its running responses (each gets its
`response.done`, `cancelled` with `server_shutting_down`) and closes (1001) after those events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from websockets.frames import CloseCode

from ..audio.vad import VadBackend
from ..engine.api import EngineHandle, PromptMeter
from ..protocol.codec import event_to_wire, parse, serialise
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.server_events import Error, OutputAudioBufferCleared, SessionCreated
from ..session import (
    Action,
    ConfirmTurn,
    DiscardTurn,
    ResponseFinished,
    Send,
    Session,
    SessionRunner,
)
from ..session.config import SessionSettings
from ..session.content import MediaLimits
from ..session.failures import log_failure
from ..session.mcp_limits import McpLimits
from .config import LimitsConfig
from .frame_parser import limits_parser
from .handshake import HandshakeInfo
from .metrics import ServerMetrics
from .outbound import ECHOES, Close, Outbound, SessionEnded
from .transport import Transport, TransportClosed

__all__ = ["ConnectionContext", "InitialConfigError", "LiveSessions", "MediaPath", "SessionEnded", "new_session", "preview_session",
           "serve_connection"]

log = logging.getLogger(__name__)



_Ender = Callable[[CloseCode, str], Awaitable[None]]


class LiveSessions:
    """The open sessions of a server, so that its shutdown ends their responses before closing them."""

    def __init__(self) -> None:
        self._enders: set[_Ender] = set()

    def __len__(self) -> int:
        return len(self._enders)

    def add(self, ender: _Ender) -> None:
        self._enders.add(ender)

    def discard(self, ender: _Ender) -> None:
        self._enders.discard(ender)

    async def end_all(self, code: CloseCode, reason: str, timeout_s: float) -> int:
        """Every session: `response.done` for each running response, then its close with `code` queued after
        them (waits at most `timeout_s` for the sessions to have done so); how many had not when it gave up."""
        tasks = [asyncio.ensure_future(end(code, reason)) for end in list(self._enders)]
        if not tasks:
            return 0
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        return len(late)


@dataclass(frozen=True, slots=True)
class ConnectionContext:
    """What every connection of one server shares."""

    engine: EngineHandle
    settings: SessionSettings
    limits: LimitsConfig
    metrics: ServerMetrics
    model_id: str
    voices: tuple[str, ...]
    default_voice: str
    make_vad: Callable[[str], VadBackend]
    media_info: Mapping[str, Any] | None = None  # the engine's media constraints (`info()["media"]`)
    voice_lookup: Callable[[str | None], Callable] | None = None  # API key -> its cloned voices' lookup
    mcp_allowed_hosts: tuple[str, ...] = ()  # server.mcp.allowed_hosts
    mcp_timeout_s: float = 10.0  # server.mcp.timeout_s
    mcp_max_response_bytes: int = 2**20  # server.mcp.max_response_bytes
    live: LiveSessions | None = None  # where the session registers for the server's shutdown
    prompt_meter: PromptMeter | None = None  # the engine's token counts of instructions, tools and speech styles

    def media_limits(self) -> MediaLimits:
        """What one stored item may hold: the model's constraints and this server's budgets."""
        return MediaLimits.from_engine(
            self.media_info,
            min_audio_ms=self.settings.min_commit_ms,
            max_audio_s=self.settings.max_input_audio_s,
            max_image_pixels=self.limits.max_image_pixels,
            max_text_chars=self.limits.max_item_text_chars,
            max_video_s=self.limits.max_video_s,
            max_images_per_s=self.limits.max_images_per_s,
            max_image_burst=self.limits.max_image_burst,
            max_video_s_per_s=self.limits.max_video_s_per_s,
            max_conversation_bytes=self.limits.max_conversation_bytes,
        )


Emit = Callable[[ServerEvent], Awaitable[None]]


class MediaPath(Protocol):
    """A transport's own media beside its event channel (WebRTC: the Opus tracks), run with the session."""

    def outgoing(self, event: ServerEvent) -> Sequence[ServerEvent]:
        """What goes on the event channel for a server event, in order (`()`: the media took it, e.g. audio)."""
        ...

    def incoming(self, event: ClientEvent | ProtocolError) -> bool:
        """True when the media path handled a client event itself (it is not given to the session)."""
        ...

    async def run(self, runner: SessionRunner, emit: Emit, touch: Callable[[], None]) -> None:
        """The media's task, until cancelled: feeds input to `runner`, sends its own events with `emit`, and calls
        `touch` when the client shows it is there (input audio keeps the session from its idle timeout)."""
        ...


class InitialConfigError(Exception):
    """The session config an ephemeral key was minted with no longer applies (e.g. its cloned voice is gone)."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.error.message)
        self.error = error


def new_session(ctx: ConnectionContext, info: HandshakeInfo) -> Session:
    """A session for a connection authenticated as `info.api_key`, with this server's settings."""
    return Session(
        ctx.settings,
        dialect=info.dialect,
        model=ctx.model_id,
        voices=ctx.voices,
        default_voice=ctx.default_voice,
        make_vad=ctx.make_vad,
        media=ctx.media_limits(),
        custom_voices=None if ctx.voice_lookup is None else ctx.voice_lookup(info.api_key),
        mcp_allowed_hosts=ctx.mcp_allowed_hosts,
        prompt_meter=ctx.prompt_meter,
    )


def _apply_initial(session: Session, configs: Sequence[Mapping[str, Any]]) -> None:
    """Apply session configs (a minted one, a call's) as the session's first `session.update`s (their
    `session.updated` is not sent: `session.created` shows the result). Raises InitialConfigError."""
    for config in configs:
        event = parse(json.dumps({"type": "session.update", "session": config}), Dialect.GA)
        if isinstance(event, ProtocolError):
            raise InitialConfigError(Error.from_protocol_error(event))
        for action in session.handle_client_event(event, time.monotonic()):
            if isinstance(action, Send) and isinstance(action.event, Error):
                raise InitialConfigError(action.event)


def preview_session(ctx: ConnectionContext, info: HandshakeInfo, configs: Sequence[Mapping[str, Any]]) -> dict:
    """The session object (GA wire form) a session opened with `configs` starts with; raises InitialConfigError.
    Checks a client secret's config when it is minted (a call's before it is answered), exactly as the session
    will apply it."""
    session = new_session(ctx, info)
    try:
        _apply_initial(session, configs)
        wire = event_to_wire(SessionCreated(session=session.config), Dialect.GA)
    finally:
        session.close()  # nothing reached the engine: the actions are dropped
    assert wire is not None
    return wire["session"]


def _observe(metrics: ServerMetrics) -> Callable[[Action], None]:
    def on_action(action: Action) -> None:
        if isinstance(action, Send) and isinstance(action.event, Error):
            metrics.errors.labels(action.event.error.code or "none").inc()
        elif isinstance(action, ResponseFinished):
            metrics.turns.labels(action.status.value).inc()
            if action.ttfa_s is not None:
                metrics.ttfa.observe(action.ttfa_s)
            for stage, seconds in action.stage_s.items():
                metrics.stage.labels(stage).observe(seconds)
        elif isinstance(action, ConfirmTurn):
            metrics.speculative.labels("confirmed").inc()
        elif isinstance(action, DiscardTurn):
            metrics.speculative.labels("discarded").inc()

    return on_action


class _IdleWatch:
    """The reader's idle timeout with one timer per idle period, not one per frame (`asyncio.timeout` around
    each receive armed and cancelled a loop timer for every 20 ms audio frame of every session: GIL time the
    engine thread waits for). The timer, when it fires, re-arms itself for the receive then in progress;
    it cancels the reader only when that receive has waited `timeout_s`."""

    __slots__ = ("_handle", "_loop", "_since", "_task", "_timeout_s", "fired")

    def __init__(self, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None
        self._timeout_s = timeout_s
        self._since: float | None = None  # loop time the receive in progress began (None: not receiving)
        self._handle: asyncio.TimerHandle | None = None
        self.fired = False

    def bind(self) -> None:
        """The reader task (the one cancelled at the timeout) is the calling one."""
        self._task = asyncio.current_task()

    def touch(self) -> None:
        """The client is there although it sends no event (a media path's input): the wait starts over."""
        if self._since is not None:
            self._since = self._loop.time()

    def receiving(self) -> None:
        self._since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(self._since + self._timeout_s, self._check)

    def received(self) -> None:
        self._since = None

    def _check(self) -> None:
        self._handle = None
        if self._since is None:  # between receives: the next one re-arms
            return
        due = self._since + self._timeout_s
        if self._loop.time() >= due:
            self.fired = True
            assert self._task is not None
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _read(ws: Transport, runner: SessionRunner, outbound: Outbound, ctx: ConnectionContext,
                info: HandshakeInfo, watch: _IdleWatch, media: MediaPath | None) -> None:
    watch.bind()
    try:
        await _read_frames(ws, runner, outbound, ctx, info, watch, media)
    finally:
        watch.close()


async def _read_frames(ws: Transport, runner: SessionRunner, outbound: Outbound, ctx: ConnectionContext,
                       info: HandshakeInfo, watch: _IdleWatch, media: MediaPath | None) -> None:
    limits = ctx.limits
    # large frames are parsed in another process
    parser = limits_parser(limits)
    while True:
        watch.receiving()
        try:
            message = await ws.recv()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not watch.fired or task is None or task.uncancel() > 0:
                raise  # cancelled by someone else (the session ends)
            error = ProtocolError(ErrorCode.IDLE_TIMEOUT, idle_s=limits.idle_timeout_s)
            ctx.metrics.errors.labels(error.code.value).inc()
            outbound.put(serialise(Error.from_protocol_error(error), info.dialect))
            outbound.put(Close(CloseCode.NORMAL_CLOSURE, f"idle timeout: no client events for {limits.idle_timeout_s:g} s"))
            return
        except TransportClosed:
            raise SessionEnded(None) from None
        watch.received()
        if len(message) > limits.max_frame_bytes:
            event = ProtocolError(ErrorCode.FRAME_TOO_LARGE, num_bytes=len(message), max_bytes=limits.max_frame_bytes)
        else:
            try:
                event = await parser.parse(message, info.dialect)
            except Exception as exc:  # parse answers every frame; a bug in it costs one error event
                log_failure(log, runner.session.config.id, "frame", None, exc)
                event = ProtocolError(ErrorCode.SERVER_ERROR)
        if isinstance(event, ProtocolError):  # at most one line per rejected frame, and only at DEBUG
            log.debug("session %s: frame rejected: %s at %s", runner.session.config.id, event.code.value, event.param)
        if media is not None and media.incoming(event):
            continue
        await runner.put_client(event)


async def _write(ws: Transport, outbound: Outbound, limits: LimitsConfig) -> None:
    while True:
        item = await outbound.get()
        if isinstance(item, Close):
            raise SessionEnded(item.code, item.reason)
        frame = item if isinstance(item, str) else item.frame()
        if frame is None:  # not reached: `emit` queues only echoes that have a wire form
            outbound.sent(item)
            continue
        try:
            async with asyncio.timeout(limits.send_timeout_s):
                await ws.send(frame)
        except TimeoutError:
            raise SessionEnded(CloseCode.POLICY_VIOLATION, "client is not reading") from None
        except TransportClosed:
            raise SessionEnded(None) from None
        outbound.sent(item)


_MAX_CLOSE_REASON_BYTES = 123  # RFC 6455 5.5: a control frame's payload is at most 125 bytes, 2 of them the code


async def _close(ws: Transport, code: CloseCode, reason: str, timeout_s: float) -> None:
    """The closing handshake within `timeout_s`; a peer that does not take it is cut off (TCP abort).
    A reason longer than a close frame can carry is cut (websockets would refuse the frame and leave
    the connection open)."""
    reason = reason.encode()[:_MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
    try:
        async with asyncio.timeout(timeout_s):
            await ws.close(code, reason)
    except TimeoutError:
        ws.abort()


async def _send_quietly(ws: Transport, frame: str | None) -> None:
    """Best-effort last message before a 1011 close (the peer may be gone already)."""
    if frame is None:
        return
    try:
        async with asyncio.timeout(1.0):
            await ws.send(frame)
    except (TimeoutError, TransportClosed):
        pass


async def serve_connection(ws: Transport, ctx: ConnectionContext, info: HandshakeInfo, *,
                           initial: Sequence[Mapping[str, Any]] = (), media: MediaPath | None = None) -> None:
    """Run one accepted realtime connection to its end (the caller has counted it as a session).

    `initial`: session configs to start with, the ephemeral key's that opened it and a call's (applied before
    `session.created`; when one no longer applies the client gets the `error` and the connection closes with
    1008). `media`: the
    transport's own media path (WebRTC), whose playout makes `output_audio_buffer.*` events legal here."""
    session = new_session(ctx, info)
    if initial:
        try:
            _apply_initial(session, initial)
        except InitialConfigError as exc:
            session.close()
            await _send_quietly(ws, serialise(exc.error, info.dialect))
            await _close(ws, CloseCode.POLICY_VIOLATION, "the client secret's session config no longer applies",
                         ctx.limits.close_timeout_s)
            return
    logger = logging.LoggerAdapter(log, {"session": session.config.id})
    # Overflow policy: past the outbound budget the session ends (1008); a client that reads too
    # slowly to ever reach it but has stopped altogether hits send_timeout_s.
    outbound = Outbound(ctx.limits.max_outbound_bytes, ctx.limits.max_outbound_events,
                         ctx.limits.max_conversation_bytes)
    playout = media is not None
    session.transport_playout = playout  # its playout says output_audio_buffer.*, not the session

    def put(event: ServerEvent) -> None:
        timing_events = session.config.timing_events
        if isinstance(event, ECHOES):  # serialised by the writer (the wire dict is cheap: it shares the strings)
            if event_to_wire(event, info.dialect, timing_events=timing_events) is not None:
                outbound.put(outbound.echo(event, info.dialect, timing_events))
            return
        # `output_audio_buffer.*` from the session itself: a WebSocket client asked for them
        # (`realtime_ming.output_audio_buffer`) or for `cleared` with its own `output_audio_buffer.clear`
        own = session.config.output_audio_buffer or isinstance(event, OutputAudioBufferCleared)
        frame = serialise(event, info.dialect, timing_events=timing_events, playout=playout or own)
        if frame is not None:
            outbound.put(frame)

    async def emit(event: ServerEvent) -> None:
        if media is None:
            put(event)
            return
        for out in media.outgoing(event):
            put(out)

    runner = SessionRunner(
        session, ctx.engine, emit=emit, on_action=_observe(ctx.metrics),
        max_pending_client=ctx.limits.max_inbound_frames,
        mcp_limits=McpLimits(frozenset(ctx.mcp_allowed_hosts), ctx.mcp_timeout_s, ctx.mcp_max_response_bytes),
    )
    watch = _IdleWatch(ctx.limits.idle_timeout_s)
    code: CloseCode | None = CloseCode.NORMAL_CLOSURE
    reason = ""
    started = time.monotonic()
    logger.info("session %s opened (%s, origin=%s)", session.config.id, info.dialect.value, info.origin)

    session_task: asyncio.Task | None = None

    async def end(close_code: CloseCode, close_reason: str) -> None:  # the server's drain deadline
        try:
            if session_task is None:  # not started: it takes the request when it starts
                await runner.end_responses()
            elif not session_task.done():  # a session ending already (its reader saw the client go) never answers
                ending = asyncio.ensure_future(runner.end_responses())
                await asyncio.wait((ending, session_task), return_when=asyncio.FIRST_COMPLETED)
                ending.cancel()
        finally:
            outbound.put(Close(close_code, close_reason))  # after the response.done frames

    if ctx.live is not None:
        ctx.live.add(end)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_read(ws, runner, outbound, ctx, info, watch, media))
            session_task = tg.create_task(runner.run())
            tg.create_task(_write(ws, outbound, ctx.limits))
            if media is not None:
                tg.create_task(media.run(runner, emit, watch.touch))
    except Exception as group:  # a TaskGroup raises only ExceptionGroups
        ended, failed = group.split(SessionEnded)
        if ended is not None:
            first = ended.exceptions[0]
            code, reason = first.code, first.reason
        if failed is not None:
            logger.error("session %s failed", session.config.id, exc_info=failed)
            code, reason = CloseCode.INTERNAL_ERROR, "internal server error"
            ctx.metrics.errors.labels(ErrorCode.SERVER_ERROR.value).inc()
            error = Error.from_protocol_error(ProtocolError(ErrorCode.SERVER_ERROR))
            await _send_quietly(ws, serialise(error, info.dialect))
    finally:
        if ctx.live is not None:
            ctx.live.discard(end)
        runner.close()  # the engine frees the active turn even when this task is cancelled
    if code is not None:
        await _close(ws, code, reason, ctx.limits.close_timeout_s)
    logger.info("session %s closed after %.1f s (%s)", session.config.id, time.monotonic() - started,
                reason or (code.name if code is not None else "client gone"))
