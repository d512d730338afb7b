"""A WebRTC call's media path (`server.connection.MediaPath`): the Opus tracks beside the event channel.

Out: the session's audio deltas never reach the data channel (as with OpenAI's WebRTC): each is decoded from
its response's output format, resampled to 48 kHz and queued on the call's `Playout`, which the output track
plays at real time. The playout's `output_audio_buffer.started` / `.stopped` go out as they happen.

Barge-in is heard exactly: at `input_audio_buffer.speech_started` (when the session's turn detection
interrupts responses) and at the client's `output_audio_buffer.clear`, the unplayed audio is dropped at once,
`output_audio_buffer.cleared` is sent, and each item cut short is truncated to what was played, as a WebSocket
client would do itself (`conversation.item.truncate` with the played milliseconds: the session answers
`conversation.item.truncated`).

In: the client's microphone track becomes `input_audio_buffer.append` events in the session's current input
format (48 kHz → its rate), 20 ms each, so server VAD, transcription and the rest run unchanged; `input_audio_buffer.append`
events on the data channel are taken too, into the same buffer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import numpy as np

from ..audio.pcm import b64decode_audio, b64encode_audio, float_to_int16
from ..audio.resample import LOW_LATENCY, StreamResampler
from ..protocol.client_events import ConversationItemTruncate, InputAudioBufferAppend, OutputAudioBufferClear
from ..protocol.errors import ProtocolError
from ..protocol.events import ClientEvent, ServerEvent
from ..protocol.server_events import (
    InputAudioBufferSpeechStarted,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
)
from ..protocol.values import AudioFormat
from ..session.audio_io import wire_format
from ..session.runner import SessionRunner
from .playout import RATE_HZ, Cut, Playout, PlayoutEvent
from .tracks import OutputTrack, read_mic

__all__ = ["CallMedia"]

log = logging.getLogger(__name__)

class _Decoder:
    """One response's audio deltas (its output format) → 48 kHz int16."""

    def __init__(self, fmt: AudioFormat) -> None:
        self._codec = wire_format(fmt)
        self._resampler = StreamResampler(self._codec.sample_rate_hz, RATE_HZ)

    def decode(self, delta: str) -> np.ndarray:
        return float_to_int16(self._resampler.process(self._codec.decode(b64decode_audio(delta))))

    def flush(self) -> np.ndarray:
        return float_to_int16(self._resampler.flush())


class _MicEncoder:
    """48 kHz mono float32 → base64 appends in an input format (rebuilt when the session's format changes)."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._codec = wire_format(fmt)
        self._resampler = StreamResampler(RATE_HZ, self._codec.sample_rate_hz, LOW_LATENCY)

    def encode(self, samples: np.ndarray) -> str:
        """The base64 payload of `samples` ("" while the resampler fills its delay line)."""
        out = self._resampler.process(samples)
        return b64encode_audio(self._codec.encode(out)) if out.size else ""


class CallMedia:
    """The media path of one call: its playout, output track and microphone (set when the peer sends one)."""

    def __init__(self) -> None:
        self.playout = Playout()
        self._pending: asyncio.Queue[ServerEvent | ClientEvent] = asyncio.Queue()  # for the `run` task
        self.track = OutputTrack(self.playout, self._post_all)
        self._mic: asyncio.Future = asyncio.get_running_loop().create_future()
        self._decoders: dict[str, _Decoder] = {}
        self._runner: SessionRunner | None = None
        self.mic_frames = 0  # 20 ms frames of the client's track given to the session

    def set_mic(self, track) -> None:
        """The client's audio track (the first one; later ones are ignored)."""
        if not self._mic.done():
            self._mic.set_result(track)

    def _post_all(self, events: Sequence[PlayoutEvent]) -> None:
        for event in events:
            self._pending.put_nowait(event)

    # ---- MediaPath ------------------------------------------------------------------------------
    def outgoing(self, event: ServerEvent) -> Sequence[ServerEvent]:
        if isinstance(event, ResponseOutputAudioDelta):
            decoder = self._decoders.get(event.response_id)
            if decoder is not None:
                self.playout.push(event.response_id, event.item_id, decoder.decode(event.delta))
            return ()
        if isinstance(event, ResponseCreated):
            self._decoders[event.response.id] = _Decoder(event.response.output_format)
        elif isinstance(event, ResponseOutputAudioDone):
            decoder = self._decoders.get(event.response_id)
            if decoder is not None:
                self.playout.push(event.response_id, event.item_id, decoder.flush())
        elif isinstance(event, ResponseDone):
            self._decoders.pop(event.response.id, None)
            return (event, *self.playout.end(event.response.id))
        elif isinstance(event, InputAudioBufferSpeechStarted) and self._interrupts():
            return (event, *self._clear(explicit=False))
        return (event,)

    def incoming(self, event: ClientEvent | ProtocolError) -> bool:
        if not isinstance(event, OutputAudioBufferClear):
            return False
        self._post_all(self._clear(explicit=True))
        return True

    async def run(self, runner: SessionRunner, emit, touch: Callable[[], None]) -> None:
        self._runner = runner
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pump(runner, emit))
            tg.create_task(self._read_mic(runner, touch))

    # ---- internals ------------------------------------------------------------------------------
    def _interrupts(self) -> bool:
        runner = self._runner
        td = None if runner is None else runner.session.config.turn_detection
        return td is not None and td.interrupt_response

    def _clear(self, *, explicit: bool) -> list[PlayoutEvent]:
        events, cuts = self.playout.clear(explicit=explicit)
        for cut in cuts:
            self._pending.put_nowait(_truncate(cut))
        return events

    async def _pump(self, runner: SessionRunner, emit) -> None:
        """Playout events to the client, truncations to the session, in the order they arose."""
        while True:
            item = await self._pending.get()
            if isinstance(item, ClientEvent):
                await runner.put_client(item)
            else:
                await emit(item)

    async def _read_mic(self, runner: SessionRunner, touch: Callable[[], None]) -> None:
        track = await self._mic
        encoder: _MicEncoder | None = None

        async def sink(samples: np.ndarray) -> None:
            nonlocal encoder
            fmt = runner.session.config.input_format
            if encoder is None or encoder.format != fmt:
                encoder = _MicEncoder(fmt)
            touch()
            self.mic_frames += 1
            audio = encoder.encode(samples)
            if audio:
                await runner.put_client(InputAudioBufferAppend(audio=audio))

        await read_mic(track, sink)
        log.debug("session %s: the client's audio track ended", runner.session.config.id)


def _truncate(cut: Cut) -> ConversationItemTruncate:
    return ConversationItemTruncate(item_id=cut.item_id, content_index=0, audio_end_ms=cut.audio_end_ms)
