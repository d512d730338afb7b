"""In-process Realtime sessions: the server's `Session` + `SessionRunner` on an engine, no socket.

`LocalAgent` offers the `RealtimeAgent` calls and event stream of `RealtimeClient`. Client events
take the same path as on a connection (wire form → `protocol.parse`), so validation and error
events are identical; server events arrive as the session's own typed objects, filtered by the
dialect exactly as `protocol.serialise` filters them (beta has no `conversation.item.done`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from functools import partial
from typing import Any

from websockets.frames import CloseCode

from ..audio.vad import VadBackend, VadKind, create_silero_session, create_vad
from ..engine.api import EngineHandle, engine_prompt_meter
from ..engine.config import EngineConfig
from ..engine.hooks import EngineHooks
from ..protocol.codec import parse
from ..protocol.dialect import Dialect, server_type_to_wire
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.server_events import Error
from ..protocol.session import DEFAULT_MODEL, DEFAULT_VOICE
from ..session import Session, SessionRunner, SessionSettings
from ..session.content import MediaLimits
from .agent import AgentOptions, Opening, RealtimeAgent
from .errors import ConnectionClosed

__all__ = ["LocalAgent"]

log = logging.getLogger(__name__)

_MAX_PENDING_CLIENT_EVENTS = 16  # calls waiting for the session task before `send` blocks


def _default_voice(settings: SessionSettings, info: dict, voices: tuple[str, ...]) -> str:
    """The server's rule: configured voice, then the engine's default, then DB30 or the first voice."""
    for wanted in (settings.voice, info.get("default_voice")):
        if wanted is not None:
            return str(wanted)
    return DEFAULT_VOICE if not voices or DEFAULT_VOICE in voices else voices[0]


class LocalAgent(RealtimeAgent):
    """A Realtime session run in this process on `engine` (e.g. `realtime_ming.engine.Engine`).

    Open with `await LocalAgent.start(engine)` or `async with LocalAgent.start(engine) as agent`;
    `LocalAgent.load(EngineConfig())` also creates (and on close, stops) its own engine. Many
    agents may share one engine. Must be used on one event loop.
    """

    def __init__(
        self,
        engine: EngineHandle,
        *,
        settings: SessionSettings,
        dialect: Dialect,
        model: str | None,
        options: AgentOptions,
        owns_engine: bool = False,
    ) -> None:
        super().__init__(dialect, options)
        self.engine = engine
        self._settings = settings
        self._model = model
        self._owns_engine = owns_engine
        self._silero: Any = None
        self._runner: SessionRunner | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def start(
        cls,
        engine: EngineHandle,
        *,
        settings: SessionSettings | None = None,
        beta: bool = False,
        model: str | None = None,
        options: AgentOptions | None = None,
    ) -> Opening[LocalAgent]:
        """Open a session on a running engine; the engine stays the caller's.

        `settings` are the server-side session defaults (VAD backend, limits); `beta` selects the
        beta dialect's event set; `model` is the id shown in `session.created` (default: the
        engine's model name).
        """
        agent = cls(engine, settings=settings or SessionSettings(), dialect=Dialect.BETA if beta else Dialect.GA,
                    model=model, options=options or AgentOptions())
        return Opening(agent._open)

    @classmethod
    def load(
        cls,
        engine_config: EngineConfig | None = None,
        *,
        settings: SessionSettings | None = None,
        beta: bool = False,
        options: AgentOptions | None = None,
        hooks: EngineHooks | None = None,
    ) -> Opening[LocalAgent]:
        """Create an engine from `engine_config` (default: the embedded tiny CPU model) off the event
        loop and open a session on it; `close()` also stops that engine. `hooks`: test and demo substitutions
        (`engine/hooks.py`, e.g. a fixed reply for the tiny model's random weights)."""

        async def open_with_engine() -> LocalAgent:
            from ..engine import Engine

            engine = await asyncio.to_thread(partial(Engine.create, engine_config or EngineConfig(), hooks=hooks))
            agent = cls(engine, settings=settings or SessionSettings(), dialect=Dialect.BETA if beta else Dialect.GA,
                        model=None, options=options or AgentOptions(), owns_engine=True)
            try:
                return await agent._open()
            except BaseException:
                await asyncio.to_thread(engine.close)
                raise

        return Opening(open_with_engine)

    async def _open(self) -> LocalAgent:
        info = dict(self.engine.info()) if hasattr(self.engine, "info") else {}
        voices = tuple(self.engine.voices()) if hasattr(self.engine, "voices") else ()
        default_voice = _default_voice(self._settings, info, voices)
        if self._settings.vad.backend == VadKind.SILERO.value:
            self._silero = await asyncio.to_thread(create_silero_session)
        session = Session(
            self._settings,
            dialect=self.dialect,
            model=self._model or str(info.get("model") or DEFAULT_MODEL),
            voices=voices or (default_voice,),
            default_voice=default_voice,
            make_vad=self._make_vad,
            media=MediaLimits.from_engine(info.get("media"), min_audio_ms=self._settings.min_commit_ms,
                                          max_audio_s=self._settings.max_input_audio_s),
            prompt_meter=engine_prompt_meter(self.engine),
        )
        self._runner = SessionRunner(session, self.engine, emit=self._emit,
                                     max_pending_client=_MAX_PENDING_CLIENT_EVENTS)
        self._task = asyncio.create_task(self._run(self._runner), name=f"local-session-{session.config.id}")
        try:
            await self._wait_created()
        except BaseException:
            await self.close()
            raise
        return self

    def _make_vad(self, backend: str) -> VadBackend:
        if backend == VadKind.SILERO.value and self._silero is None:
            self._silero = create_silero_session()
        return create_vad(VadKind(backend), silero_session=self._silero)

    async def _run(self, runner: SessionRunner) -> None:
        """The session task; a failure ends the stream as the server would (error event, 1011)."""
        try:
            await runner.run()
        except Exception:
            log.exception("local session %s failed", runner.session.config.id)
            if not self._events.full():  # when full, the 1011 end below reports the failure alone
                self._events.put_nowait(Error.from_protocol_error(ProtocolError(ErrorCode.SERVER_ERROR)))
            self._finish(ConnectionClosed(CloseCode.INTERNAL_ERROR, "internal server error"))
        finally:
            runner.close()  # frees the engine turn and KV slot even when cancelled

    async def _emit(self, event: ServerEvent) -> None:
        if server_type_to_wire(event.type, self.dialect) is None:
            return  # what `protocol.serialise` drops for this dialect never reaches a client
        await self._deliver(event)

    async def _transmit(self, event: ClientEvent) -> None:
        assert self._runner is not None
        # Through the wire form, so the session sees exactly what a socket would deliver.
        await self._runner.put_client(parse(json.dumps(event.to_wire(self.dialect)), self.dialect))

    async def close(self) -> None:
        """Stop the session: cancel its active turn, free its engine slot, end the event stream;
        stops the engine too when `load()` created it. Unread events are discarded. Idempotent."""
        if self._is_closing:
            return
        self._is_closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._finish(ConnectionClosed(None, "closed by the client"), discard_pending=True)
        if self._owns_engine:
            await asyncio.to_thread(self.engine.close)
