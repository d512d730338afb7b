"""SDK end to end on the real tiny engine: RealtimeClient over loopback and LocalAgent in-process.

One test body per behaviour runs on both transports (and both dialects where they differ) and
must give the protocol's documented event order; WAVs are checked against the wire bytes;
auth, protocol and session errors surface as the documented exceptions or typed error events.
The engine's thinker emits a fixed reply (`forced_reply`; every model stage still runs) because
the tiny random-weight model's own text is byte noise that the talker cannot speak.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import wave

import numpy as np
import pytest
import soundfile as sf
from conftest import tiny_engine_fixture
from server_support import seconds
from websockets.asyncio.server import serve
from websockets.frames import CloseCode

from realtime_ming.protocol import (
    Conversation,
    ConversationCreated,
    Dialect,
    Error,
    ErrorCode,
    ResponseOutputAudioDelta,
    ResponseStatus,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    StatusReason,
    serialise,
)
from realtime_ming.sdk import (
    AgentOptions,
    AuthenticationError,
    ClientOptions,
    ConnectError,
    ConnectionClosed,
    LocalAgent,
    ProtocolViolation,
    RealtimeAgent,
    RealtimeClient,
    ReconnectPolicy,
    ServerError,
    TurnResult,
)
from realtime_ming.server import RealtimeServer, load_config

pytestmark = pytest.mark.timeout(240)

FORCED_REPLY = "Hello there. How are you today?"
MAX_TOKENS = 16
TRANSPORTS = ("client", "local")

TEXT_TURN_GA = [
    "session.created", "session.updated",
    "conversation.item.added", "conversation.item.done",
    "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "conversation.item.done", "response.done",
]
AUDIO_TURN_GA_WITHOUT_DELTAS = [
    "session.created", "session.updated",
    "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
    "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
    "response.output_item.done", "conversation.item.done", "response.done",
]
AUDIO_DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta"}


# The real engine on the embedded tiny model, answering with FORCED_REPLY (loaded once); `server` is conftest's.
engine = tiny_engine_fixture(forced_reply=FORCED_REPLY)


def open_agent(transport: str, server: RealtimeServer, engine, *, beta: bool = False, raise_on_error: bool = False):
    """The same session through either transport."""
    if transport == "client":
        return RealtimeClient.connect(f"ws://127.0.0.1:{server.port}/v1/realtime", model="ming", beta=beta,
                                      options=ClientOptions(raise_on_error=raise_on_error))
    return LocalAgent.start(engine, beta=beta, options=AgentOptions(raise_on_error=raise_on_error))


def collapse_deltas(types: list[str]) -> list[str]:
    """Event types with each run of one delta type shown once."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


def wire_audio(turn: TurnResult) -> bytes:
    """The exact PCM16 bytes of the turn's audio deltas."""
    return b"".join(base64.b64decode(e.delta) for e in turn.events if isinstance(e, ResponseOutputAudioDelta))


async def text_turn(agent: RealtimeAgent) -> TurnResult:
    await agent.update_session(turn_detection=None, max_output_tokens=MAX_TOKENS)
    await agent.add_text("Hello!")
    await agent.create_response(output_modalities="text")
    return await agent.collect_turn(timeout_s=seconds(60))


async def audio_turn(agent: RealtimeAgent, wav_path) -> TurnResult:
    await agent.update_session(turn_detection=None, max_output_tokens=MAX_TOKENS)
    await agent.send_audio(wav_path)
    await agent.commit()
    await agent.create_response()
    return await agent.collect_turn(timeout_s=seconds(120))


@pytest.fixture
def tone_wav(tmp_path):
    """0.5 s of a 220 Hz tone at 16 kHz (the SDK resamples it to the 24 kHz session rate)."""
    path = tmp_path / "tone.wav"
    t = np.arange(8000) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return path


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_text_turn_event_sequence(transport, dialect, server, engine):
    """A text turn gives the documented event order (beta: no conversation.item.done) and the forced reply."""
    async with open_agent(transport, server, engine, beta=dialect is Dialect.BETA) as agent:
        turn = await text_turn(agent)
    expected = TEXT_TURN_GA if dialect is Dialect.GA else [t for t in TEXT_TURN_GA if t != "conversation.item.done"]
    assert collapse_deltas([e.type for e in turn.events]) == expected
    assert turn.status is ResponseStatus.INCOMPLETE
    assert turn.status_details is not None and turn.status_details.reason is StatusReason.MAX_OUTPUT_TOKENS
    assert turn.usage is not None and turn.usage.output_text_tokens == MAX_TOKENS
    assert turn.text and (FORCED_REPLY * 2).startswith(turn.text)
    assert turn.audio.size == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_audio_turn_event_sequence(transport, server, engine, tone_wav):
    """A committed audio turn gives the documented event order, transcript deltas before audio deltas, and audio."""
    async with open_agent(transport, server, engine) as agent:
        turn = await audio_turn(agent, tone_wav)
    types = [e.type for e in turn.events]
    assert [t for t in types if t not in AUDIO_DELTAS] == AUDIO_TURN_GA_WITHOUT_DELTAS
    delta_positions = [i for i, t in enumerate(types) if t in AUDIO_DELTAS]
    assert types.index("response.content_part.added") < delta_positions[0]
    assert delta_positions[-1] < types.index("response.output_audio.done")
    assert types.index("response.output_audio_transcript.delta") < types.index("response.output_audio.delta")
    assert turn.sample_rate_hz == 24000 and turn.audio.size > 0
    assert (FORCED_REPLY * 2).startswith(turn.text)


async def test_sdk_client_and_local_agent_give_the_same_turn(server, engine, tone_wav):
    """The same audio turn through both transports: identical event order (delta runs collapsed), transcript delta count, text and usage."""
    turns = {}
    for transport in TRANSPORTS:
        async with open_agent(transport, server, engine) as agent:
            turns[transport] = await audio_turn(agent, tone_wav)
    client, local = turns["client"], turns["local"]

    def kinds(turn: TurnResult) -> tuple[list[str], int]:
        types = [e.type for e in turn.events]
        return [t for t in types if t != "response.output_audio_transcript.delta"], types.count(
            "response.output_audio_transcript.delta")

    assert collapse_deltas(kinds(client)[0]) == collapse_deltas(kinds(local)[0])
    assert kinds(client)[1] == kinds(local)[1] > 0
    assert client.text == local.text
    assert (client.status, client.usage.output_text_tokens) == (local.status, local.usage.output_text_tokens)


@pytest.mark.parametrize("rate_hz", [24000, 44100])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_saved_wav_has_session_rate_and_wire_samples(transport, rate_hz, server, engine, tmp_path):
    """save_wav writes a mono 16-bit WAV whose header rate is the output rate and whose frames are the wire bytes."""
    async with open_agent(transport, server, engine) as agent:
        await agent.update_session(turn_detection=None, output_format=rate_hz, max_output_tokens=MAX_TOKENS)
        await agent.add_text("Speak, please.")
        await agent.create_response()
        turn = await agent.collect_turn(timeout_s=seconds(120))
    pcm = wire_audio(turn)
    assert turn.sample_rate_hz == rate_hz
    assert turn.audio.size == len(pcm) // 2 > 0
    path = turn.save_wav(tmp_path / "reply.wav")
    with wave.open(str(path)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (rate_hz, 1, 2)
        assert wav.getnframes() == turn.audio.size
        assert wav.readframes(wav.getnframes()) == pcm
    assert turn.duration_s == pytest.approx(len(pcm) / 2 / rate_hz)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_error_event_is_returned_by_default(transport, server, engine):
    """With raise_on_error off, a cancel without a response arrives as a typed Error and the session goes on."""
    async with open_agent(transport, server, engine) as agent:
        await agent.cancel()
        await agent.update_session(instructions="still here")
        events = [await agent.recv() for _ in range(3)]
    assert [e.type for e in events] == ["session.created", "error", "session.updated"]
    error = events[1]
    assert isinstance(error, Error)
    assert error.error.code == ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE.value
    assert error.error.type == "invalid_request_error"
    assert error.error.message == ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE.render()
    assert isinstance(events[2], SessionUpdated) and events[2].session.instructions == "still here"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_raise_on_error_raises_server_error(transport, server, engine):
    """With raise_on_error on, an empty commit raises ServerError(input_audio_buffer_commit_empty); the next event follows."""
    async with open_agent(transport, server, engine, raise_on_error=True) as agent:
        await agent.update_session(turn_detection=None)
        await agent.commit()
        assert isinstance(await agent.recv(), SessionCreated)
        assert isinstance(await agent.recv(), SessionUpdated)
        with pytest.raises(ServerError) as info:
            await agent.recv()
        await agent.update_session(instructions="after the error")
        after = await agent.recv()
    assert info.value.code == ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY.value
    assert info.value.error_type == "invalid_request_error"
    assert str(info.value) == "input_audio_buffer_commit_empty: " + ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY.render(
        min_ms=100, buffered_ms=0.0)
    assert isinstance(after, SessionUpdated) and after.session.instructions == "after the error"


async def test_sdk_wrong_or_missing_key_raises_authentication_error(engine):
    """A server with API keys refuses a missing or wrong key with AuthenticationError(401), never retried."""
    cfg = load_config(None, ["server.port=0", "server.auth.api_keys=[secret]"])
    retries: list[tuple] = []
    async with RealtimeServer(cfg, engine) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
        for key in (None, "wrong"):
            with pytest.raises(AuthenticationError) as info:
                await RealtimeClient.connect(url, api_key=key, on_retry=lambda *args: retries.append(args))
            assert info.value.status == 401
            assert info.value.body == "Missing or invalid API key.\n"
        async with RealtimeClient.connect(url, api_key="secret") as client:
            assert isinstance(await client.recv(), SessionCreated)
    assert retries == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_sdk_connect_error_after_every_attempt_failed():
    """Connecting to a closed port retries max_attempts times, calling on_retry between, then raises ConnectError."""
    retries: list[tuple] = []
    policy = ReconnectPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with pytest.raises(ConnectError, match=r"after 3 attempts"):
        await RealtimeClient.connect(f"ws://127.0.0.1:{_free_port()}", options=ClientOptions(reconnect=policy),
                                     on_retry=lambda *args: retries.append(args))
    assert [attempt for attempt, _, _ in retries] == [1, 2]
    assert all(0.009 <= delay <= 0.022 for _, delay, _ in retries)


async def test_sdk_connect_retries_while_the_server_is_full(engine):
    """A server at its session limit closes with 1013; connect backs off and succeeds once the slot is free."""
    cfg = load_config(None, ["server.port=0", "server.limits.max_sessions=1"])
    async with RealtimeServer(cfg, engine) as srv:
        url = f"ws://127.0.0.1:{srv.port}"
        first = await RealtimeClient.connect(url)
        closing: list[asyncio.Task] = []
        retries: list[int] = []

        def on_retry(attempt: int, delay_s: float, error: Exception) -> None:
            retries.append(attempt)
            if not closing:
                closing.append(asyncio.get_running_loop().create_task(first.close()))

        policy = ReconnectPolicy(max_attempts=100, initial_backoff_s=0.02, max_backoff_s=0.1)
        async with RealtimeClient.connect(url, options=ClientOptions(reconnect=policy), on_retry=on_retry) as second:
            assert isinstance(await second.recv(), SessionCreated)
        await closing[0]
    assert retries[0] == 1


@pytest.mark.parametrize("resume", [False, True])
async def test_sdk_server_close_ends_or_resumes_the_session(resume, engine):
    """On the server's idle close (1000) iteration stops; with resume the session reopens and changes are replayed."""
    cfg = load_config(None, ["server.port=0", "server.limits.idle_timeout_s=0.5"])
    options = ClientOptions(reconnect=ReconnectPolicy(resume=resume))
    events = []
    async with (
        RealtimeServer(cfg, engine) as srv,
        RealtimeClient.connect(f"ws://127.0.0.1:{srv.port}", options=options) as client,
    ):
        await client.update_session(instructions="remember me")
        async with asyncio.timeout(seconds(20)):
            async for event in client:
                events.append(event)
                if len(events) == 5:
                    break
    types = [e.type for e in events]
    assert types[:3] == ["session.created", "session.updated", "error"]
    assert events[2].error.code == ErrorCode.IDLE_TIMEOUT.value
    if not resume:
        assert len(events) == 3
        return
    assert types[3:] == ["session.created", "session.updated"]
    assert events[3].session.id != events[0].session.id
    assert events[4].session.instructions == "remember me"


async def _fake_server(frames: list[str], close_code: CloseCode | None = None):
    async def handler(ws) -> None:
        for frame in frames:
            await ws.send(frame)
        if close_code is None:
            await ws.wait_closed()
        else:
            await ws.close(close_code, "boom")

    return await serve(handler, "127.0.0.1", 0)


CREATED = serialise(SessionCreated(session=SessionConfig()), Dialect.GA)


async def test_sdk_unreadable_server_frame_raises_protocol_violation():
    """A frame that is not a valid server event ends the stream with ProtocolViolation carrying the frame."""
    bad = '{"type":"response.output_audio.delta","delta":5}'
    async with (
        await _fake_server([CREATED, bad]) as srv,
        RealtimeClient.connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}") as client,
    ):
        assert isinstance(await client.recv(), SessionCreated)
        with pytest.raises(ProtocolViolation) as info:
            await client.recv()
        with pytest.raises(ProtocolViolation):
            await client.recv()
    assert info.value.frame == bad
    assert "malformed response.output_audio.delta" in str(info.value)


async def test_sdk_connect_requires_session_created_first():
    """A server whose first event is not session.created is refused with ProtocolViolation."""
    frame = serialise(ConversationCreated(conversation=Conversation("conv_1")), Dialect.GA)
    async with await _fake_server([frame]) as srv:
        with pytest.raises(ProtocolViolation, match="expected session.created first, got conversation.created"):
            await RealtimeClient.connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}")


async def test_sdk_abnormal_close_raises_connection_closed():
    """A close other than 1000 makes the event iteration raise ConnectionClosed with the server's code and reason."""
    async with (
        await _fake_server([CREATED], close_code=CloseCode.INTERNAL_ERROR) as srv,
        RealtimeClient.connect(f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}") as client,
    ):
        seen = []
        with pytest.raises(ConnectionClosed) as info:
            async for event in client:
                seen.append(event.type)
    assert seen == ["session.created"]
    assert (info.value.code, info.value.reason) == (CloseCode.INTERNAL_ERROR, "boom")


class _FaultyEngine:
    """The real engine, except that submitting a turn raises (an injected session fault)."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def submit(self, request, sink) -> None:
        raise RuntimeError("injected fault")

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


async def test_sdk_local_agent_fault_fails_only_that_response(engine):
    """A fault inside a LocalAgent session, as on the server: a server_error event and a failed
    response; the session itself lives on and answers the next request."""
    async with LocalAgent.start(_FaultyEngine(engine)) as agent:
        await agent.update_session(turn_detection=None)
        await agent.add_text("Hello")
        await agent.create_response()
        events = []
        async for event in agent:
            events.append(event)
            if event.type == "response.done":
                break
        errors = [e for e in events if e.type == "error"]
        assert [e.error.code for e in errors] == [ErrorCode.SERVER_ERROR.value]
        assert events[-1].response.status.value == "failed"
        await agent.add_text("Still there?")
        async for event in agent:
            if event.type == "conversation.item.done":
                break


async def test_sdk_local_agent_close_mid_response_frees_the_engine(engine):
    """Closing a LocalAgent while it is speaking cancels its turn: the engine holds no turn afterwards."""
    async with LocalAgent.start(engine) as agent:
        await agent.update_session(turn_detection=None, max_output_tokens=MAX_TOKENS)
        await agent.add_text("Talk to me.")
        await agent.create_response()
        async for event in agent:
            if isinstance(event, ResponseOutputAudioDelta):
                break
    stats = await asyncio.to_thread(engine.stats)
    assert stats.turns == 0
    with pytest.raises(ConnectionClosed):
        await agent.recv()
