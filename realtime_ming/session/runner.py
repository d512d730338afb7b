"""asyncio driver of one `Session`: client events and engine events in, actions carried out.

Transport-neutral (the WebSocket handler and the in-process SDK both use it): the owner feeds
client events with `put_client`, hands `engine_sink` to the engine (which calls it from its own
thread), runs `run()` as the session task and calls `close()` when the connection ends.
Server events leave through the owner's `emit` coroutine, so its queue sets the backpressure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable

from ..engine.api import EngineHandle, TurnEvent
from ..protocol.client_events import InputAudioBufferAppend
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from .actions import (
    Action,
    CancelTurn,
    CloseConversation,
    ConfirmTurn,
    DiscardTurn,
    Send,
    SubmitTurn,
)
from .audio_io import wire_duration_ms
from .session import Session

__all__ = ["SessionRunner"]

log = logging.getLogger(__name__)

_Inbound = ClientEvent | ProtocolError


class _EngineInput:
    """An engine event on the inbox (distinguishes it from client input)."""

    __slots__ = ("event",)

    def __init__(self, event: TurnEvent) -> None:
        self.event = event


_audio_pool: concurrent.futures.ThreadPoolExecutor | None = None
_audio_pool_lock = threading.Lock()


def _audio_workers() -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide pool that decodes appends and runs their VAD, off the event loop."""
    global _audio_pool
    with _audio_pool_lock:
        if _audio_pool is None:
            _audio_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="session-audio")
        return _audio_pool


class AudioPacer:
    """Token bucket over input audio time: `audio_burst_s` at once, then `max_audio_rate` x real time."""

    def __init__(self, rate: float, burst_s: float) -> None:
        self._rate = rate
        self._burst_ms = burst_s * 1000.0
        self._credit_ms = self._burst_ms
        self._t = time.monotonic()

    def delay_s(self, audio_ms: float, now: float) -> float:
        """Seconds to wait before taking `audio_ms` more of input (0 when within budget)."""
        if self._rate <= 0:
            return 0.0
        self._credit_ms = min(self._burst_ms, self._credit_ms + (now - self._t) * 1000.0 * self._rate)
        self._t = now
        self._credit_ms -= audio_ms
        return max(0.0, -self._credit_ms / (1000.0 * self._rate))


class SessionRunner:
    """Moves one session's inputs and actions; all methods except `engine_sink` run on `loop`.

    Inbox policy: client input is admitted while fewer than `max_pending_client` client events
    wait (`put_client` blocks beyond, which stops the socket reader); engine events are always
    accepted because the engine thread must never block. Their backlog is bounded in time by
    the owner's send timeout: a client that stops reading is disconnected and the turn cancelled.
    """

    def __init__(
        self,
        session: Session,
        engine: EngineHandle,
        *,
        emit: Callable[[ServerEvent], Awaitable[None]],
        on_action: Callable[[Action], None] | None = None,
        max_pending_client: int = 16,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.session = session
        self._engine = engine
        self._emit = emit
        self._on_action = on_action
        self._loop = loop or asyncio.get_running_loop()
        self._inbox: asyncio.Queue[_Inbound | _EngineInput] = asyncio.Queue()
        self._client_slots = asyncio.Semaphore(max_pending_client)
        self._is_closed = False
        settings = session.settings
        self._pacer = AudioPacer(settings.max_audio_rate, settings.audio_burst_s)
        self._worker: concurrent.futures.Future | None = None  # an append being handled off the loop

    def engine_sink(self, event: TurnEvent) -> None:
        """Thread-safe: called by the engine thread for every event of this session's turns."""
        if self._is_closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, _EngineInput(event))
        except RuntimeError:  # the loop is closed: the session is gone, nobody wants the event
            pass

    async def put_client(self, event: _Inbound) -> None:
        """Queue a parsed client event (or its parse error); waits while the inbox is full.

        Cancel-safe: a cancelled call queues nothing. Audio appends beyond the session's ingestion
        rate wait here, so the socket reader stops and TCP flow control slows the client down.
        """
        if isinstance(event, InputAudioBufferAppend):
            ms = wire_duration_ms(self.session.config.input_format, len(event.audio))
            delay = self._pacer.delay_s(ms, time.monotonic())
            if delay > 0:
                await asyncio.sleep(delay)
        await self._client_slots.acquire()
        self._inbox.put_nowait(event)

    async def run(self) -> None:
        """The session task: start the session, then apply inputs in arrival order until cancelled."""
        await self._dispatch(self.session.start())
        while True:
            item = await self._inbox.get()
            now = time.monotonic()
            if isinstance(item, _EngineInput):
                actions = self.session.handle_engine_event(item.event, now)
            elif isinstance(item, InputAudioBufferAppend):
                self._client_slots.release()
                actions = await self._off_loop(item, now)
            else:
                self._client_slots.release()
                actions = self.session.handle_client_event(item, now)
            await self._dispatch(actions)

    async def _off_loop(self, event: InputAudioBufferAppend, now: float) -> list[Action]:
        """Handle an append (decode, resample, VAD) on a worker thread: the loop keeps serving every
        other connection. The session is not touched meanwhile (this task waits for the result)."""
        self._worker = _audio_workers().submit(self.session.handle_client_event, event, now)
        return await asyncio.wrap_future(self._worker)

    def close(self) -> None:
        """Synchronous teardown (safe in `finally`): cancel the active turn, discard a speculative
        one and free the conversation's KV slot in the engine. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        worker = self._worker
        if worker is not None and not worker.done():
            # an append still runs on a worker thread with the session: close it when that is done
            # (engine commands are thread-safe), so a speculative turn it submitted is freed too
            worker.add_done_callback(lambda _f: self._close_session())
        else:
            self._close_session()

    def _close_session(self) -> None:
        for action in self.session.close():
            self._command(action)

    async def _dispatch(self, actions: list[Action]) -> None:
        for action in actions:
            if self._on_action is not None:
                self._on_action(action)
            if isinstance(action, Send):
                await self._emit(action.event)
            else:
                self._command(action)

    def _command(self, action: Action) -> None:
        engine = self._engine
        if isinstance(action, SubmitTurn):
            engine.submit(action.request, self.engine_sink)
        elif isinstance(action, ConfirmTurn):
            engine.confirm(action.turn_id)
        elif isinstance(action, DiscardTurn):
            engine.discard(action.turn_id)
        elif isinstance(action, CancelTurn):
            engine.cancel(action.turn_id)
        elif isinstance(action, CloseConversation):
            engine.close_conversation(action.conversation_id)
