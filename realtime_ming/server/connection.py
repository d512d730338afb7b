"""One `/v1/realtime` connection: reader, session and writer tasks in one TaskGroup, over any `Transport`.

The reader parses frames into client events (oversize frames become `frame_too_large` errors),
the session task runs the `SessionRunner`, the writer sends serialised events with a send
timeout. A clean end (client gone, idle timeout, slow client) is raised by the task that saw it
as `SessionEnded`; the handler then closes with that code and frees the engine turn.

Memory: what waits to be sent is bounded in bytes (`max_outbound_bytes`, the frame being sent
included) and in frames; a client that lets more pile up is not reading and is closed with 1008.
The close itself is bounded (`close_timeout_s`): a peer that never reads cannot take the closing
handshake, so its TCP connection is then aborted and the session's memory freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from websockets.frames import CloseCode

from ..audio.vad import VadBackend
from ..engine.api import EngineHandle
from ..protocol.codec import parse, serialise
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.events import ServerEvent
from ..protocol.server_events import Error
from ..session import (
    Action,
    ConfirmTurn,
    DiscardTurn,
    ResponseFinished,
    Send,
    Session,
    SessionRunner,
)
from ..session.runner import SessionClosing
from ..session.config import SessionSettings
from ..session.content import MediaLimits
from ..session.failures import log_failure
from .config import LimitsConfig
from .handshake import HandshakeInfo
from .metrics import ServerMetrics
from .transport import Transport, TransportClosed

__all__ = ["ConnectionContext", "SessionEnded", "serve_connection"]

log = logging.getLogger(__name__)


class SessionEnded(SessionClosing):
    """A task saw the session end; `code` None = the socket is already closed."""

    def __init__(self, code: CloseCode | None, reason: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Close:
    """Writer sentinel: flush everything queued before it, then close with `code`."""

    code: CloseCode
    reason: str


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

    def media_limits(self) -> MediaLimits:
        """What one stored item may hold: the model's constraints and this server's budgets."""
        return MediaLimits.from_engine(
            self.media_info,
            min_audio_ms=self.settings.min_commit_ms,
            max_audio_s=self.settings.max_input_audio_s,
            max_image_pixels=self.limits.max_image_pixels,
            max_text_chars=self.limits.max_item_text_chars,
            max_video_s=self.limits.max_video_s,
            max_conversation_bytes=self.limits.max_conversation_bytes,
        )


class _Outbound:
    """Frames waiting for the writer, bounded in bytes (a frame counts until its send completed) and in
    number. `put` never blocks: past a bound the client is not reading, and the session ends (1008)."""

    def __init__(self, max_bytes: int, max_frames: int) -> None:
        self._queue: asyncio.Queue[str | _Close] = asyncio.Queue()
        self._max_bytes, self._max_frames = max_bytes, max_frames
        self.nbytes = 0  # memory held by queued and in-flight frames

    def put(self, item: str | _Close) -> None:
        if isinstance(item, str):
            size = sys.getsizeof(item)
            if self.nbytes and (self.nbytes + size > self._max_bytes or self._queue.qsize() >= self._max_frames):
                raise SessionEnded(
                    CloseCode.POLICY_VIOLATION,
                    f"client is not reading: {self.nbytes + size} bytes / {self._queue.qsize() + 1} events "
                    f"to send exceed the limit of {self._max_bytes} bytes / {self._max_frames} events",
                )
            self.nbytes += size
        self._queue.put_nowait(item)

    async def get(self) -> str | _Close:
        return await self._queue.get()

    def sent(self, frame: str) -> None:
        self.nbytes -= sys.getsizeof(frame)


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


async def _read(ws: Transport, runner: SessionRunner, outbound: _Outbound, ctx: ConnectionContext,
                info: HandshakeInfo) -> None:
    limits = ctx.limits
    while True:
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                message = await ws.recv()
        except TimeoutError:
            error = ProtocolError(ErrorCode.IDLE_TIMEOUT, idle_s=limits.idle_timeout_s)
            ctx.metrics.errors.labels(error.code.value).inc()
            outbound.put(serialise(Error.from_protocol_error(error), info.dialect))
            outbound.put(_Close(CloseCode.NORMAL_CLOSURE, f"idle timeout: no client events for {limits.idle_timeout_s:g} s"))
            return
        except TransportClosed:
            raise SessionEnded(None) from None
        if len(message) > limits.max_frame_bytes:
            event = ProtocolError(ErrorCode.FRAME_TOO_LARGE, num_bytes=len(message), max_bytes=limits.max_frame_bytes)
        else:
            try:
                event = parse(message, info.dialect)
            except Exception as exc:  # parse answers every frame; a bug in it costs one error event
                log_failure(log, runner.session.config.id, "frame", None, exc)
                event = ProtocolError(ErrorCode.SERVER_ERROR)
        if isinstance(event, ProtocolError):  # at most one line per rejected frame, and only at DEBUG
            log.debug("session %s: frame rejected: %s at %s", runner.session.config.id, event.code.value, event.param)
        await runner.put_client(event)


async def _write(ws: Transport, outbound: _Outbound, limits: LimitsConfig) -> None:
    while True:
        item = await outbound.get()
        if isinstance(item, _Close):
            raise SessionEnded(item.code, item.reason)
        try:
            async with asyncio.timeout(limits.send_timeout_s):
                await ws.send(item)
        except TimeoutError:
            raise SessionEnded(CloseCode.POLICY_VIOLATION, "client is not reading") from None
        except TransportClosed:
            raise SessionEnded(None) from None
        outbound.sent(item)


async def _close(ws: Transport, code: CloseCode, reason: str, timeout_s: float) -> None:
    """The closing handshake within `timeout_s`; a peer that does not take it is cut off (TCP abort)."""
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


async def serve_connection(ws: Transport, ctx: ConnectionContext, info: HandshakeInfo) -> None:
    """Run one accepted realtime connection to its end (the caller has counted it as a session)."""
    session = Session(
        ctx.settings,
        dialect=info.dialect,
        model=ctx.model_id,
        voices=ctx.voices,
        default_voice=ctx.default_voice,
        make_vad=ctx.make_vad,
        media=ctx.media_limits(),
        custom_voices=None if ctx.voice_lookup is None else ctx.voice_lookup(info.api_key),
    )
    logger = logging.LoggerAdapter(log, {"session": session.config.id})
    # Overflow policy: past the outbound budget the session ends (1008); a client that reads too
    # slowly to ever reach it but has stopped altogether hits send_timeout_s.
    outbound = _Outbound(ctx.limits.max_outbound_bytes, ctx.limits.max_outbound_events)

    async def emit(event: ServerEvent) -> None:
        frame = serialise(event, info.dialect, timing_events=session.config.timing_events)
        if frame is not None:
            outbound.put(frame)

    runner = SessionRunner(
        session, ctx.engine, emit=emit, on_action=_observe(ctx.metrics),
        max_pending_client=ctx.limits.max_inbound_frames,
    )
    code: CloseCode | None = CloseCode.NORMAL_CLOSURE
    reason = ""
    started = time.monotonic()
    logger.info("session %s opened (%s, origin=%s)", session.config.id, info.dialect.value, info.origin)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_read(ws, runner, outbound, ctx, info))
            tg.create_task(runner.run())
            tg.create_task(_write(ws, outbound, ctx.limits))
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
        runner.close()  # the engine frees the active turn even when this task is cancelled
    if code is not None:
        await _close(ws, code, reason, ctx.limits.close_timeout_s)
    logger.info("session %s closed after %.1f s (%s)", session.config.id, time.monotonic() - started,
                reason or (code.name if code is not None else "client gone"))
