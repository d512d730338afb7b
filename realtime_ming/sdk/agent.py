"""The API shared by `RealtimeClient` (socket) and `LocalAgent` (in-process): calls in, typed events out.

`RealtimeAgent` builds typed client events (`session.update`, `input_audio_buffer.append`, …) and
hands them to its transport's `_transmit`; the transport feeds server events back through
`_deliver` into one bounded queue that `recv()` / `async for` read. Overflow policy of that queue:
the producer waits (socket reading or the session task pauses), nothing is dropped.
"""

from __future__ import annotations

import abc
import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Generic, Self, TypeVar

from websockets.frames import CloseCode

from ..audio import pcm
from ..protocol import client_events as ce
from ..protocol.audio_input import InputTranscription, NoiseReduction, TurnDetection
from ..protocol.dialect import Dialect
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import (
    ConversationItem,
    ImageDetail,
    InputImage,
    InputText,
    ItemReference,
    MessageItem,
    OutputText,
    Role,
)
from ..protocol.server_events import Error, SessionCreated, SessionUpdated
from ..protocol.session import SessionConfig, SessionPatch, SessionType, parse_session_update
from ..protocol.values import (
    AudioFormat,
    FunctionTool,
    MaxOutputTokens,
    Modality,
    ToolChoice,
)
from ..session.audio_io import wire_format
from . import content
from .audio import AudioInput, encode_input_audio
from .errors import ConnectionClosed, RealtimeError, ServerError
from .transcripts import Transcripts
from .tools import ToolRunner
from .turn import TurnCollector, TurnResult

__all__ = ["UNSET", "AgentOptions", "Opening", "RealtimeAgent"]


class _Unset:
    """Marker of an argument left out (distinct from None, which can mean "off")."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()
_END: Final = object()  # queue sentinel: the stream is over, `recv` raises `_end`

AgentT = TypeVar("AgentT", bound="RealtimeAgent")


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Behaviour shared by both transports.

    `raise_on_error`: `recv()` raises `ServerError` for `error` events instead of returning them.
    `max_queued_events`: server events read but not yet consumed; beyond, reading pauses.
    `open_timeout_s`: how long opening waits for `session.created`.
    """

    raise_on_error: bool = False
    max_queued_events: int = 4096
    open_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_queued_events < 1:
            raise ValueError("max_queued_events must be >= 1")
        if self.open_timeout_s <= 0:
            raise ValueError("open_timeout_s must be > 0")


class Opening(Generic[AgentT]):
    """What `connect()` / `start()` return: await it for the agent, or use `async with` (closes it)."""

    def __init__(self, open_agent: Callable[[], Awaitable[AgentT]]) -> None:
        self._open_agent = open_agent
        self._agent: AgentT | None = None

    def __await__(self) -> Generator[Any, None, AgentT]:
        return self._open_agent().__await__()

    async def __aenter__(self) -> AgentT:
        self._agent = await self._open_agent()
        return self._agent

    async def __aexit__(self, *exc_info: object) -> None:
        if self._agent is not None:
            await self._agent.close()


class RealtimeAgent(abc.ABC):
    """One Realtime session, whatever carries it. Drive it from one event loop and one reader.

    Calls send client events and return at once (answers arrive as events); `recv()` or
    `async for event in agent` yields typed `realtime_ming.protocol` server events in order.
    """

    def __init__(self, dialect: Dialect, options: AgentOptions) -> None:
        self.dialect = dialect
        self.options = options
        self._events: asyncio.Queue[Any] = asyncio.Queue(maxsize=options.max_queued_events)
        self._end: RealtimeError | None = None
        self._is_closing = False
        self._session: SessionConfig | None = None
        self._created = asyncio.Event()
        self._input_format = AudioFormat()
        self._requested: dict[str, Any] = {}  # every session change asked for (replayed on resume)
        self.transcripts = Transcripts()  # user audio items' transcripts (session `transcription` on)
        self.tool_runner = ToolRunner(self.send)  # registered function tools (`add_tool`)

    # ---- transport contract ------------------------------------------------------------------
    @abc.abstractmethod
    async def _transmit(self, event: ClientEvent) -> None:
        """Carry one client event to the session (the transport implements this)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session and release what it holds; unread events are discarded. Idempotent."""

    async def _deliver(self, event: ServerEvent) -> None:
        """Transport side: queue one server event (waits while the queue is full)."""
        if isinstance(event, SessionCreated | SessionUpdated):
            self._session = event.session
            self._input_format = event.session.input_format
        self.transcripts.observe(event)
        if self.tool_runner.observe(event):  # the refusal of the runner's own follow-up request
            return
        await self._events.put(event)
        if isinstance(event, SessionCreated):
            self._created.set()

    def _finish(self, error: RealtimeError, *, discard_pending: bool = False) -> None:
        """Transport side: no more events; `recv` raises `error` once the queue is drained
        (at once with `discard_pending`, used when this side closed the session)."""
        if discard_pending:
            while not self._events.empty():
                self._events.get_nowait()
        if self._end is not None:
            return
        self._end = error
        self._created.set()
        if self._events.empty():
            self._events.put_nowait(_END)  # wakes a reader blocked on an empty queue

    async def _wait_created(self) -> None:
        """Wait for `session.created` (bounded by `open_timeout_s`); raises the end error if any."""
        async with asyncio.timeout(self.options.open_timeout_s):
            await self._created.wait()
        if self._session is None:
            raise self._end or ConnectionClosed(None, "closed before session.created")

    # ---- state -------------------------------------------------------------------------------
    @property
    def session(self) -> SessionConfig:
        """The effective session from the latest `session.created` / `session.updated` read."""
        if self._session is None:
            raise RuntimeError("the session has not been created yet")
        return self._session

    @property
    def is_closed(self) -> bool:
        """Whether the event stream has ended (closed by either side)."""
        return self._end is not None

    # ---- events in ---------------------------------------------------------------------------
    async def recv(self) -> ServerEvent:
        """The next server event. Raises `ConnectionClosed` (or the transport's error) at the end,
        `ServerError` for `error` events when `raise_on_error` is on. Cancel-safe."""
        if self._end is not None and self._events.empty():
            raise self._end
        item = await self._events.get()
        if item is _END:
            assert self._end is not None
            raise self._end
        if self.options.raise_on_error and isinstance(item, Error):
            raise ServerError(item)
        return item

    def __aiter__(self) -> RealtimeAgent:
        return self

    async def __anext__(self) -> ServerEvent:
        """Events until the session ends: a close by this side or a normal (1000) close stops the
        iteration; any other end raises its error."""
        try:
            return await self.recv()
        except ConnectionClosed as exc:
            if self._is_closing or exc.code == CloseCode.NORMAL_CLOSURE:
                raise StopAsyncIteration from None
            raise

    async def collect_turn(self, *, timeout_s: float | None = 120.0, since: float | None = None) -> TurnResult:
        """Read events up to the end of the next (or current) response and return it assembled.

        `since` is the `time.monotonic()` origin of the timings (default: now). Waits for the
        `realtime_ming.response.timings` event too when the session enabled `timing_events`.
        Raises `TimeoutError` after `timeout_s`; events read so far are then lost to the caller.
        """
        origin = time.monotonic() if since is None else since
        expect_timings = self._session is not None and self._session.timing_events
        output_format = self._session.output_format if self._session is not None else AudioFormat()
        collector = TurnCollector(origin, output_format, expect_timings=expect_timings)
        async with asyncio.timeout(timeout_s):
            while not collector.is_complete:
                event = await self.recv()
                collector.add(event, time.monotonic())
        return collector.result()

    # ---- calls -------------------------------------------------------------------------------
    async def send(self, event: ClientEvent) -> None:
        """Send any typed client event (the other calls are shortcuts for this)."""
        if isinstance(event, ce.SessionUpdate):
            self._requested.update(event.session.changes)
            if "input_format" in event.session.changes:
                self._input_format = event.session.changes["input_format"]
        if self._end is not None:
            raise self._end
        await self._transmit(event)

    async def update_session(
        self,
        *,
        instructions: str | _Unset = UNSET,
        output_modalities: str | Modality | Sequence[str | Modality] | _Unset = UNSET,
        voice: str | _Unset = UNSET,
        speed: float | _Unset = UNSET,
        input_format: AudioFormat | int | _Unset = UNSET,
        output_format: AudioFormat | int | _Unset = UNSET,
        turn_detection: TurnDetection | _Unset = UNSET,
        transcription: InputTranscription | None | _Unset = UNSET,
        noise_reduction: NoiseReduction | None | _Unset = UNSET,
        tools: Sequence[FunctionTool] | _Unset = UNSET,
        tool_choice: ToolChoice | _Unset = UNSET,
        max_output_tokens: MaxOutputTokens | _Unset = UNSET,
        temperature: float | _Unset = UNSET,
        timing_events: bool | _Unset = UNSET,
        session_type: SessionType | str | _Unset = UNSET,
        output_lead_ms: int | None | _Unset = UNSET,
        output_audio_buffer: bool | _Unset = UNSET,
    ) -> None:
        """Send a `session.update` with the given fields; the rest stays as it is.

        `session_type="transcription"` (GA) makes a transcription session: committed audio (server VAD
        turns or `commit()`) is transcribed into `transcripts`, and no response is ever created.

        `turn_detection=None` switches server VAD off (manual `commit()` + `create_response()`);
        an int format means PCM16 at that rate (44100 = Ming's native output). `output_lead_ms` bounds the unplayed
        reply audio the server lets this client hold (it paces the deltas; None: as fast as generated, for a
        client that buffers or saves the audio itself); `output_audio_buffer=True` asks for the GA
        `output_audio_buffer.*` playout events (docs/barge_in.md). The answer is a
        `session.updated` (or an `error`) event. Raises `ValueError` for a field this dialect
        cannot carry (GA has no `temperature`; beta only 24 kHz PCM and no session type).
        """
        given = {
            "instructions": instructions, "voice": voice, "speed": speed, "turn_detection": turn_detection,
            "transcription": transcription, "noise_reduction": noise_reduction, "tool_choice": tool_choice,
            "max_output_tokens": max_output_tokens, "temperature": temperature, "timing_events": timing_events,
            "output_modalities": output_modalities if isinstance(output_modalities, _Unset)
            else content.modalities(output_modalities),
            "input_format": input_format if isinstance(input_format, _Unset) else content.audio_format(input_format),
            "output_format": output_format if isinstance(output_format, _Unset) else content.audio_format(output_format),
            "tools": tools if isinstance(tools, _Unset) else tuple(tools),
            "session_type": session_type if isinstance(session_type, _Unset) else SessionType(session_type),
            "output_lead_ms": output_lead_ms, "output_audio_buffer": output_audio_buffer,
        }
        patch = SessionPatch({k: v for k, v in given.items() if not isinstance(v, _Unset)}, self.dialect)
        self._check_expressible(patch)
        await self.send(ce.SessionUpdate(session=patch))

    def _check_expressible(self, patch: SessionPatch) -> None:
        try:
            carried = parse_session_update(patch.to_wire(self.dialect), self.dialect).changes
        except ProtocolError:
            return  # a value the server will reject: its `error` event says why
        missing = sorted(set(patch.changes) - set(carried))
        if missing:
            raise ValueError(f"{', '.join(missing)} cannot be set on a {self.dialect.value} connection")

    async def send_audio(
        self,
        audio: AudioInput,
        *,
        sample_rate_hz: int | None = None,
        realtime: bool = False,
        chunk_ms: int | None = None,
    ) -> float:
        """Append audio to the input buffer; returns its duration in seconds.

        `audio`: wire bytes in the session input format, a float/int16 array [n] (or [n, ch]) at
        `sample_rate_hz` (default: the input rate), or a soundfile-readable path; arrays and files
        are resampled and encoded for the session's input format. `realtime=True` paces the
        appends at the wall clock like a microphone (`chunk_ms`, default 20; else 200 per append).
        Cancelling stops between appends.
        """
        fmt = self._input_format
        if isinstance(audio, bytes | bytearray | memoryview):
            data = encode_input_audio(audio, fmt)  # checks whole samples; no work worth a thread
        else:  # file reads and resampling stay off the event loop
            data = await asyncio.to_thread(encode_input_audio, audio, fmt, sample_rate_hz)
        codec = wire_format(fmt)
        step_ms = chunk_ms or (20 if realtime else 200)
        step = codec.bytes_per_sample * max(1, codec.sample_rate_hz * step_ms // 1000)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index, offset in enumerate(range(0, len(data), step)):
            await self.send(ce.InputAudioBufferAppend(audio=pcm.b64encode_audio(data[offset : offset + step])))
            if realtime:  # the wall clock is the pacing itself, as with a live microphone
                await asyncio.sleep(max(0.0, start + (index + 1) * step_ms / 1000 - loop.time()))
        return codec.duration_ms(len(data)) / 1000

    async def stream_file(self, path: str | os.PathLike, *, realtime: bool = True, chunk_ms: int = 20) -> float:
        """Stream an audio file (any soundfile format and rate) into the input buffer, paced at real
        time by default; returns the seconds sent. Same as `send_audio(path, ...)`."""
        return await self.send_audio(path, realtime=realtime, chunk_ms=chunk_ms)

    async def commit(self) -> None:
        """Turn the buffered input audio into a user item (needed when turn detection is off)."""
        await self.send(ce.InputAudioBufferCommit())

    async def clear_audio(self) -> None:
        """Drop the buffered, uncommitted input audio."""
        await self.send(ce.InputAudioBufferClear())

    async def create_response(
        self,
        *,
        instructions: str | None = None,
        output_modalities: str | Modality | Sequence[str | Modality] | None = None,
        voice: str | None = None,
        output_format: AudioFormat | int | None = None,
        max_output_tokens: MaxOutputTokens | None = None,
        temperature: float | None = None,
        metadata: Mapping[str, str] | None = None,
        tool_choice: ToolChoice | None = None,
        out_of_band: bool = False,
        input: Sequence[ConversationItem | ItemReference | str] | None = None,
    ) -> None:
        """Ask for a response; None keeps the session's value. `out_of_band=True` answers outside
        the conversation; `input` (items, references or item ids) replaces the context."""
        context = None if input is None else tuple(ItemReference(x) if isinstance(x, str) else x for x in input)
        params = ce.ResponseParams(
            conversation=ce.ConversationMode.NONE if out_of_band else ce.ConversationMode.AUTO,
            instructions=instructions,
            output_modalities=None if output_modalities is None else content.modalities(output_modalities),
            voice=voice,
            output_format=None if output_format is None else content.audio_format(output_format),
            max_output_tokens=max_output_tokens,
            temperature=temperature,
            metadata=metadata,
            tool_choice=tool_choice,
            input=context,
        )
        await self.send(ce.ResponseCreate(response=params))

    async def add_tool(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> FunctionTool:
        """Register `fn` (sync or async) as a function tool and put every registered tool in the session.

        When the model calls it, the agent runs `fn(**arguments)`, sends the result as a
        `function_call_output` item once the response is done, then asks for a new response (see
        `sdk.tools`). The schema comes from `fn`'s annotations unless `parameters` is given; the
        description from its docstring. Handled calls are listed in `tool_runner.results`. While another
        response holds the conversation, the follow-up waits for it (or is that response, when it started
        after the results went in).
        """
        tool = self.tool_runner.add(fn, name=name, description=description, parameters=parameters)
        await self.update_session(tools=tuple(self.tool_runner.tools.values()))
        return tool

    async def cancel(self, response_id: str | None = None) -> None:
        """Cancel the active response (answer: `response.done` with status `cancelled`)."""
        await self.send(ce.ResponseCancel(response_id=response_id))

    async def clear_output_audio(self) -> None:
        """Cut off the reply the user is hearing (`output_audio_buffer.clear`): the active response is cancelled,
        the item is truncated at the played position (`conversation.item.truncated`) and the server answers
        `output_audio_buffer.cleared`."""
        await self.send(ce.OutputAudioBufferClear())

    async def truncate(self, item_id: str, audio_end_ms: int, content_index: int = 0) -> None:
        """Tell the server the user heard only `audio_end_ms` of assistant item `item_id` (barge-in);
        the item's audio and transcript are cut there and an active response for it is cancelled."""
        await self.send(ce.ConversationItemTruncate(
            item_id=item_id, content_index=content_index, audio_end_ms=int(audio_end_ms)
        ))

    async def add_item(self, item: ConversationItem, *, previous_item_id: str | None = None) -> str:
        """Insert a conversation item (after `previous_item_id`, `"root"` = first); returns its id."""
        item_id = item.id or new_id(IdPrefix.ITEM)  # minted here so the caller knows it at once
        await self.send(ce.ConversationItemCreate(item=replace(item, id=item_id), previous_item_id=previous_item_id))
        return item_id

    async def add_text(self, text: str, *, role: Role | str = Role.USER, previous_item_id: str | None = None) -> str:
        """Add a text message (user by default, or `system` / `assistant`); returns the item id.
        It does not start a response: call `create_response()`."""
        role = Role(role)
        part = OutputText(text) if role is Role.ASSISTANT else InputText(text)
        return await self.add_item(MessageItem(role=role, content=(part,)), previous_item_id=previous_item_id)

    async def add_image(
        self,
        image: Any,
        *,
        text: str | None = None,
        detail: ImageDetail | str | None = None,
        previous_item_id: str | None = None,
    ) -> str:
        """Add a user message with an image (path, encoded bytes, [H, W, 3] uint8 array or PIL
        image) and optional text; returns the item id. GA dialect only (beta has no images)."""
        url = await asyncio.to_thread(content.image_data_url, image)
        parts: list[Any] = [InputImage(url, None if detail is None else ImageDetail(detail))]
        if text is not None:
            parts.append(InputText(text))
        return await self.add_item(MessageItem(role=Role.USER, content=tuple(parts)), previous_item_id=previous_item_id)

    async def add_video(
        self,
        video: Any,
        *,
        fps: float | None = None,
        timestamps_s: Sequence[float] | None = None,
        text: str | None = None,
        mime_type: str | None = None,
        previous_item_id: str | None = None,
    ) -> str:
        """Add a user message with a short video clip through Ming's video path (the `input_video`
        extension, docs/protocol.md §4.1; GA dialect only) and optional text; returns the item id.

        `video` is a video file path or its encoded bytes (sent as a `data:video/...` URL, `mime_type`
        or the file suffix names the container; the server decodes it with its `video` extra), or a
        sequence of frames (paths, encoded images, [H, W, 3] uint8 arrays, PIL images) shown at
        `timestamps_s` or at a constant `fps`. The server samples it at the model's 2 frames per second.
        """
        part = await asyncio.to_thread(content.video_part, video, fps, timestamps_s, mime_type)
        parts: list[Any] = [part] + ([InputText(text)] if text is not None else [])
        return await self.add_item(MessageItem(role=Role.USER, content=tuple(parts)), previous_item_id=previous_item_id)

    async def delete_item(self, item_id: str) -> None:
        """Remove an item from the conversation (answer: `conversation.item.deleted`)."""
        await self.send(ce.ConversationItemDelete(item_id=item_id))

    async def retrieve_item(self, item_id: str) -> None:
        """Ask for the server's copy of an item, audio included (answer: `conversation.item.retrieved`)."""
        await self.send(ce.ConversationItemRetrieve(item_id=item_id))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
