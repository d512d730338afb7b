"""asyncio driver of one `Session`: client events and engine events in, actions carried out.

Transport-neutral (the WebSocket handler and the in-process SDK both use it): the owner feeds
client events with `put_client`, hands `engine_sink` to the engine (which calls it from its own
thread), runs `run()` as the session task and calls `close()` when the connection ends.
Server events leave through the owner's `emit` coroutine, so its queue sets the backpressure.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from ..engine.api import EngineHandle, TurnEvent, TurnTask, engine_supports
from ..protocol.client_events import InputAudioBufferAppend
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.server_events import Error, InputAudioBufferSpeechStopped
from ..protocol.mcp import McpCallError
from .actions import (
    Action,
    CallMcpTool,
    CancelTurn,
    CloseConversation,
    ConfirmTurn,
    DiscardTurn,
    ListMcpTools,
    Send,
    SubmitTurn,
)
from .audio_io import wire_duration_ms
from .content import media_parts
from .failures import log_failure
from .mcp_limits import McpFailure, McpLimits
from .session import Session
from .shutdown import end_responses

__all__ = ["SessionClosing", "SessionRunner"]

log = logging.getLogger(__name__)

_Inbound = ClientEvent | ProtocolError

# Image and audio decoding runs here, off the event loop; two workers bound the decode memory of a
# burst of large images across all sessions.
_MEDIA_DECODER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="media-decode")


# Appends taken into one worker call at most (a session that fell behind: see `SessionRunner._take_appends`).
_MAX_APPEND_BATCH = 16


def _settle(done: asyncio.Future, results: list) -> None:
    if not done.done():  # the session task may have been cancelled meanwhile
        done.set_result(results)


class SessionClosing(Exception):
    """Raised by `emit` when the transport ends the session (client gone, not reading): not a failure
    of the request being handled, so the runner lets it through to its caller."""


class _DecisionReady:
    """The end-of-turn call a passed decision point waited for is done (posted by its decision thread), or the
    wait for a words judgement ran out (posted by a loop timer)."""

    __slots__ = ()


class _McpOutcome:
    """A listing or call of a remote MCP server ended (posted by its task)."""

    __slots__ = ("item_id", "is_call", "outcome")

    def __init__(self, item_id: str, is_call: bool, outcome: object) -> None:
        self.item_id, self.is_call, self.outcome = item_id, is_call, outcome
class _OutputDue:
    """The session's `output_deadline` passed (posted by a loop timer): paced output is due, a hold expired."""

    __slots__ = ()


class _ShutDown:
    """The server's drain deadline (`SessionRunner.end_responses`): set `done` once the responses ended."""

    __slots__ = ("done",)

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done


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
        mcp_limits: McpLimits | None = None,
    ) -> None:
        self.session = session
        self._engine = engine
        self._emit = emit
        self._on_action = on_action
        self._loop = loop or asyncio.get_running_loop()
        self._inbox: asyncio.Queue[_Inbound | _EngineInput | _DecisionReady | _McpOutcome | _ShutDown | _OutputDue] = (
            asyncio.Queue())
        self._mcp_limits = mcp_limits or McpLimits(session.mcp_allowed_hosts)
        self._mcp_tasks: set[asyncio.Task] = set()  # listings and calls running (cancelled by `close`)
        self._client_slots = asyncio.Semaphore(max_pending_client)
        self._is_closed = False
        settings = session.settings
        self._pacer = AudioPacer(settings.max_audio_rate, settings.audio_burst_s)
        self._worker: concurrent.futures.Future | None = None  # an append being handled off the loop
        self._watched: concurrent.futures.Future | None = None  # the end-of-turn call _watch_decision follows
        self._words_timer: tuple[float, asyncio.TimerHandle] | None = None  # (deadline, its timer)
        self._output_timer: tuple[float, asyncio.TimerHandle] | None = None  # (the session's output deadline, its timer)
        self._arrivals: collections.deque[float] = collections.deque()  # when each queued append came in
        self._decision_posted_at = 0.0  # when the last _DecisionReady was posted
        # handled next
        self._held: _Inbound | _EngineInput | _DecisionReady | _McpOutcome | _ShutDown | _OutputDue | None = None
        session.set_turn_judgement(engine_supports(engine, TurnTask.JUDGE_TURN))

    def engine_sink(self, event: TurnEvent) -> None:
        """Thread-safe: called by the engine thread for every event of this session's turns."""
        self._post(_EngineInput(event))

    async def put_client(self, event: _Inbound) -> None:
        """Queue a parsed client event (or its parse error); waits while the inbox is full.

        Cancel-safe: a cancelled call queues nothing. Audio appends beyond the session's ingestion
        rate wait here, so the socket reader stops and TCP flow control slows the client down.
        """
        arrived = time.monotonic()
        if isinstance(event, InputAudioBufferAppend):
            ms = wire_duration_ms(self.session.config.input_format, len(event.audio))
            delay = self._pacer.delay_s(ms, time.monotonic())
            if delay > 0:
                await asyncio.sleep(delay)
        await self._client_slots.acquire()
        if isinstance(event, InputAudioBufferAppend):
            self._arrivals.append(arrived)
        self._inbox.put_nowait(event)

    async def end_responses(self) -> None:
        """The server's drain deadline: end every running response (`shutdown.end_responses`) on the session task,
        after the inputs queued before; returns once their events went to `emit` (the caller bounds the wait)."""
        done = self._loop.create_future()
        self._inbox.put_nowait(_ShutDown(done))
        await asyncio.shield(done)

    async def run(self) -> None:
        """The session task: start the session, then apply inputs in arrival order until cancelled.

        An unexpected failure never ends it: a client request that fails is answered with one
        `server_error` event (echoing its `event_id`), a turn whose output cannot be handled ends
        `failed`, and each failure is logged as one line (`failures.log_failure`).
        """
        await self._dispatch(self.session.start(), None)
        while True:
            if self._held is not None:
                item, self._held = self._held, None
            else:
                item = await self._inbox.get()
            now = time.monotonic()
            if isinstance(item, _EngineInput):
                try:
                    actions = self.session.handle_engine_event(item.event, now)
                except Exception as exc:
                    turn_id = item.event.turn_id
                    self._log_failure(type(item.event).__name__, turn_id, exc)
                    actions = self.session.abort_response(turn_id, now)
                await self._dispatch(actions, None)
                self._watch_words()
            elif isinstance(item, _McpOutcome):
                handle = self.session.on_mcp_called if item.is_call else self.session.on_mcp_listed
                try:
                    actions = handle(item.item_id, item.outcome, now)
                except Exception as exc:
                    self._log_failure("MCP outcome", item.item_id, exc)
                    actions = []
                await self._dispatch(actions, None)
            elif isinstance(item, _OutputDue):
                try:
                    actions = self.session.on_output_timer(now)
                except Exception as exc:  # the reply's output cannot be sent: its response ends failed
                    turn_id = self.session.active_response_id
                    self._log_failure("output timer", turn_id, exc)
                    actions = [] if turn_id is None else self.session.abort_response(turn_id, now)
                await self._dispatch(actions, None)
            elif isinstance(item, _DecisionReady):
                try:
                    actions = self.session.on_decision_ready(now)
                except Exception as exc:  # the silence fallback still ends the turn
                    self._log_failure("end-of-turn decision", None, exc)
                    actions = []
                await self._dispatch(actions, None)
                self._log_turn_end(actions, "late decision", self._decision_posted_at, now, now)
                self._watch_words()
            elif isinstance(item, _ShutDown):
                try:
                    await self._dispatch(self.session.playout.release(now), None)  # a finished reply completes
                    await self._dispatch(end_responses(self.session.responses, now), None)
                finally:
                    if not item.done.done():
                        item.done.set_result(None)
            elif isinstance(item, InputAudioBufferAppend):
                batch = self._take_appends(item)
                arrived = []
                for _ in batch:
                    self._client_slots.release()
                    arrived.append(self._arrivals.popleft() if self._arrivals else now)
                results = await self._off_loop(batch, now)
                handled = time.monotonic()
                for append, actions, at in zip(batch, results, arrived):
                    if isinstance(actions, BaseException):
                        raise actions
                    await self._dispatch(actions, append)
                    self._log_turn_end(actions, "append", at, now, handled)
                self._watch_decision()
                self._watch_words()
            else:
                self._client_slots.release()
                if media_parts(item):
                    await self._loop.run_in_executor(_MEDIA_DECODER, self.session.predecode, item, now)
                    now = time.monotonic()
                limits = self.session.prompt_limits
                if limits.wants(item):  # instructions, tools, speech style: their tokens are counted off the loop
                    await self._loop.run_in_executor(_MEDIA_DECODER, limits.premeasure_event, self.session.config, item)
                    now = time.monotonic()
                await self._dispatch(self.session.handle_client_event(item, now), item)
            self._watch_output()

    def _log_turn_end(self, actions: list[Action], cause: str, arrived: float, dequeued: float, handled: float) -> None:
        """DEBUG: where the server's wall time went for the input that ended a turn (speech_stopped sent)."""
        if not log.isEnabledFor(logging.DEBUG) or not any(
                isinstance(a, Send) and isinstance(a.event, InputAudioBufferSpeechStopped) for a in actions):
            return
        sent = time.monotonic()
        log.debug("turn end (%s): queued %.1f ms, handled %.1f ms, events sent %.1f ms after; %.1f ms in all",
                  cause, (dequeued - arrived) * 1e3, (handled - dequeued) * 1e3, (sent - handled) * 1e3,
                  (sent - arrived) * 1e3)

    def _watch_decision(self) -> None:
        """An append left semantic_vad's decision waiting on its model call: act on the answer when it comes,
        whether or not more audio arrives (the append thread did not wait for it)."""
        call = self.session.pending_decision
        if call is None or call is self._watched:
            return
        self._watched = call
        call.add_done_callback(lambda _f: self._post_decision())

    def _watch_words(self) -> None:
        """semantic_vad judged a pause complete by prosody and waits for the words judgement: once its wait runs
        out, decide on prosody alone even if no audio and no judgement arrive meanwhile."""
        deadline = self.session.words_deadline
        if deadline is None or (self._words_timer is not None and self._words_timer[0] == deadline):
            return
        if self._words_timer is not None:
            self._words_timer[1].cancel()
        delay = max(0.0, deadline - time.monotonic()) + 1e-3
        self._words_timer = (deadline, self._loop.call_later(delay, self._post_decision))

    def _watch_output(self) -> None:
        """Wake the session at its `output_deadline` (the next paced audio piece, a hold's end, a reply played out)
        even if no input comes meanwhile; one timer, moved when the deadline moves."""
        deadline = self.session.output_deadline
        timer = self._output_timer
        if timer is not None and (deadline is None or timer[0] != deadline):
            timer[1].cancel()
            self._output_timer = timer = None
        if deadline is None or timer is not None:
            return
        delay = max(0.0, deadline - time.monotonic())
        self._output_timer = (deadline, self._loop.call_later(delay, self._output_due))

    def _output_due(self) -> None:
        self._output_timer = None
        if not self._is_closed:
            self._inbox.put_nowait(_OutputDue())

    def _post_decision(self) -> None:
        self._decision_posted_at = time.monotonic()
        self._post(_DecisionReady())

    def _post(self, item: _DecisionReady | _EngineInput) -> None:
        """Thread-safe: queue an item for the session task (dropped once the session or loop is gone)."""
        if self._is_closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, item)
        except RuntimeError:  # the loop is closed: the session is gone, nobody wants the event
            pass

    def _take_appends(self, first: InputAudioBufferAppend) -> list[InputAudioBufferAppend]:
        """`first` and the appends queued right behind it (up to the next other input, which is held for the
        next turn of the loop): a session that fell behind catches up in one worker call, not one each."""
        batch = [first]
        while len(batch) < _MAX_APPEND_BATCH and not self._inbox.empty():
            item = self._inbox.get_nowait()
            if not isinstance(item, InputAudioBufferAppend):
                self._held = item
                break
            batch.append(item)
        return batch

    async def _off_loop(self, batch: list[InputAudioBufferAppend], now: float) -> list[list[Action] | BaseException]:
        """Handle appends (decode, resample, VAD) on a worker thread: the loop keeps serving every other
        connection. The session is not touched meanwhile (this task waits for the result). Per append: its
        actions, or the exception that stopped the batch there (the appends after it are not handled).

        The answer comes back by one `call_soon_threadsafe` (not `wrap_future`'s chained futures): per 20 ms
        frame of every session, the loop's share of the hop is GIL time that the engine thread waits for."""
        done = self._loop.create_future()
        self._worker = _audio_workers().submit(self._handle_appends, batch, now, done)
        return await done

    def _handle_appends(self, batch: list[InputAudioBufferAppend], now: float,
                        done: asyncio.Future) -> None:
        """On a session-audio thread: run the session's append handling, then hand the results to the loop."""
        results: list[list[Action] | BaseException] = []
        for event in batch:
            try:
                results.append(self.session.handle_client_event(event, now))
            except BaseException as exc:  # noqa: BLE001 -- handed to the session task, which raises it as before
                results.append(exc)
                break
        try:
            self._loop.call_soon_threadsafe(_settle, done, results)
        except RuntimeError:  # the loop is closed: nobody waits for the answer
            pass

    def close(self) -> None:
        """Synchronous teardown (safe in `finally`): cancel the active turn, discard a speculative
        one and free the conversation's KV slot in the engine. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        for task in self._mcp_tasks:  # a listing or call in flight: its result has nobody to go to
            task.cancel()
        if self._words_timer is not None:
            self._words_timer[1].cancel()
        if self._output_timer is not None:
            self._output_timer[1].cancel()
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

    async def _dispatch(self, actions: list[Action], cause: _Inbound | None) -> None:
        """Carry out `actions` in order; one that fails does not stop the others. A failure is
        reported once, as a `server_error` event for the client request `cause` (if any)."""
        failure: Exception | None = None
        lost_turns: list[str] = []  # turns the engine never took: their responses cannot finish
        for action in actions:
            try:
                if self._on_action is not None:
                    self._on_action(action)
                if isinstance(action, Send):
                    await self._emit(action.event)
                else:
                    self._command(action)
            except SessionClosing:
                raise
            except Exception as exc:
                failure = failure or exc
                if isinstance(action, SubmitTurn | ConfirmTurn):
                    lost_turns.append(action.request.turn_id if isinstance(action, SubmitTurn) else action.turn_id)
        if failure is not None:
            await self._report(failure, cause)
        for turn_id in lost_turns:
            await self._dispatch(self.session.abort_response(turn_id, time.monotonic()), None)

    async def _report(self, failure: Exception, cause: _Inbound | None) -> None:
        event_id = cause.event_id if cause is not None else None
        request = "server event" if cause is None else getattr(cause, "type", "rejected frame")
        self._log_failure(request, event_id, failure)
        error = Error.from_protocol_error(ProtocolError(ErrorCode.SERVER_ERROR, event_id=event_id))
        try:
            await self._emit(error)
        except SessionClosing:
            raise
        except Exception as exc:  # nothing more can be told to this client about it
            self._log_failure("error", event_id, exc)

    def _log_failure(self, request: str, request_id: str | None, exc: Exception) -> None:
        log_failure(log, self.session.config.id, request, request_id, exc)

    def _start_mcp(self, action: ListMcpTools | CallMcpTool) -> None:
        """Run a listing or call as a task of this runner; its outcome (or failure) comes back on the inbox."""
        limits = self._mcp_limits

        async def run() -> None:
            try:
                if isinstance(action, ListMcpTools):
                    outcome: object = await _mcp_client().list_tools(action.server, limits)
                else:
                    outcome = await _mcp_client().call_tool(action.server, action.name, action.arguments, limits)
            except McpFailure as failure:
                outcome = failure.error
            except Exception as exc:  # a bug in the client costs this call, never the session
                self._log_failure("MCP", action.item_id, exc)
                outcome = McpCallError("protocol_error", "the MCP exchange failed on this server")
            if not self._is_closed:
                self._inbox.put_nowait(_McpOutcome(action.item_id, isinstance(action, CallMcpTool), outcome))

        task = self._loop.create_task(run())
        self._mcp_tasks.add(task)
        task.add_done_callback(self._mcp_tasks.discard)

    def _command(self, action: Action) -> None:
        engine = self._engine
        if isinstance(action, ListMcpTools | CallMcpTool):
            self._start_mcp(action)
        elif isinstance(action, SubmitTurn):
            engine.submit(action.request, self.engine_sink)
        elif isinstance(action, ConfirmTurn):
            engine.confirm(action.turn_id)
        elif isinstance(action, DiscardTurn):
            engine.discard(action.turn_id)
        elif isinstance(action, CancelTurn):
            engine.cancel(action.turn_id)
        elif isinstance(action, CloseConversation):
            engine.close_conversation(action.conversation_id)


def _mcp_client():
    """The MCP client module, imported when a session first lists or calls a remote MCP tool: the `mcp` package
    and its HTTP stack load only on a server whose sessions use MCP tools."""
    from . import mcp_client

    return mcp_client
