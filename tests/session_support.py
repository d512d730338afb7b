"""The session tests' harness: a Sans-I/O `Session` driven with wire frames and scripted engine events.

`Harness` validates every frame the session sends (server_support.validate_frame) and keeps the engine
commands it issues; the helpers build the turns the tests start from. Nothing here is a test;
`test_session*.py`, `test_transcription*.py`, `test_barge_in_hold.py`, `test_speech_style.py` and
`test_protocol_support.py` import it.
"""

from __future__ import annotations

import json
import time

import numpy as np
from server_support import EnergyVad, b64_pcm16_samples, pcm16_b64, silence, tone, validate_frame

from realtime_ming.engine.api import AudioChunk, FinishReason, Stage, StageMark, TextDelta, TurnDone
from realtime_ming.protocol import Dialect, parse, serialise
from realtime_ming.session import Send, Session, SessionSettings, SubmitTurn
from realtime_ming.session.content import MediaLimits

ENGINE_HZ = 44100
MODEL_HZ = 16000
PCM16K = {"type": "audio/pcm", "rate": 16000}


# the events that close a spoken response, in order
AUDIO_CLOSE = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


class Harness:
    """A session plus the frames it sent (validated) and the engine commands it issued.

    Its output is unpaced unless `settings` say otherwise (`SessionSettings.output_lead_ms`): the harness has no
    timer, and most tests look at what a turn sends, not when (the pacing tests drive `tick`)."""

    def __init__(self, dialect: Dialect = Dialect.GA, settings: SessionSettings | None = None,
                 media: MediaLimits | None = None, prompt_meter=None, custom_voices=None,
                 mcp_allowed_hosts: tuple[str, ...] = ()) -> None:
        self.dialect = dialect
        self.session = Session(
            settings or SessionSettings(output_lead_ms=None),
            dialect=dialect,
            model="ming-test",
            voices=("DB30", "other"),
            default_voice="DB30",
            make_vad=lambda _backend: EnergyVad(),
            media=media,
            prompt_meter=prompt_meter,
            custom_voices=custom_voices,
            mcp_allowed_hosts=mcp_allowed_hosts,
        )
        self.frames: list[dict] = []
        self.commands: list = []
        self.allow_opt_in = False  # the opt-in GA events may come whatever the session says (a client asked)
        self._take(self.session.start())

    def _take(self, actions: list) -> list:
        for action in actions:
            if isinstance(action, Send):
                timings = self.session.config.timing_events
                playout = self.allow_opt_in or self.session.config.output_audio_buffer
                text = serialise(action.event, self.dialect, timing_events=timings, playout=playout)
                if text is None:
                    continue
                frame = json.loads(text)
                td = self.session.config.turn_detection
                idle = getattr(td, "idle_timeout_ms", None) is not None or any(
                    type(t).__name__ == "McpTool" for t in self.session.config.tools)
                validate_frame(frame, self.dialect, allow_timings=timings, allow_opt_in=idle, allow_playout=playout)
                self.frames.append(frame)
            else:
                self.commands.append(action)
        return actions

    def send(self, **event) -> list:
        """Feed one client event given as wire fields."""
        return self.send_at(time.monotonic(), **event)

    def send_at(self, now: float, **event) -> list:
        """Feed one client event at session time `now` (a deterministic clock: the media rate tests)."""
        return self._take(self.session.handle_client_event(parse(json.dumps(event), self.dialect), now))

    def create_at(self, now: float, event_id: str, *parts: dict) -> str:
        """`conversation.item.create` of a user message of `parts` at `now`: "added", or the code of the one
        error it got instead."""
        since = len(self.frames)
        self.send_at(now, type="conversation.item.create", event_id=event_id, item=user_message(*parts))
        types = self.types(since)
        if types == ["conversation.item.added", "conversation.item.done"]:
            return "added"
        assert types == ["error"], types
        return last_error(self)["code"]

    def append(self, samples: np.ndarray, chunk_samples: int = 320) -> None:
        for start in range(0, samples.size, chunk_samples):
            self.send(type="input_audio_buffer.append", audio=pcm16_b64(samples[start : start + chunk_samples]))

    def engine(self, event) -> list:
        return self._take(self.session.handle_engine_event(event, time.monotonic()))

    def engine_at(self, now: float, event) -> list:
        """Feed one engine event at session time `now`."""
        return self._take(self.session.handle_engine_event(event, now))

    def apply(self, actions: list) -> list:
        """Actions the session returned outside a handler (e.g. the runner's drain deadline), taken as the runner does."""
        return self._take(actions)

    def tick(self, now: float) -> list:
        """The session's output timer at `now` (what `SessionRunner` calls at `output_deadline`)."""
        return self._take(self.session.on_output_timer(now))

    def types(self, since: int = 0) -> list[str]:
        return [f["type"] for f in self.frames[since:]]

    def last(self, event_type: str) -> dict:
        return [f for f in self.frames if f["type"] == event_type][-1]

    def submitted(self) -> list:
        return [c.request for c in self.commands if isinstance(c, SubmitTurn)]

    def manual_audio_turn(self, seconds: float = 0.5) -> None:
        """Manual mode, 16 kHz input, one committed user audio item."""
        self.send(type="session.update", session={
            "type": "realtime", "audio": {"input": {"format": PCM16K, "turn_detection": None}}})
        self.append(tone(seconds, MODEL_HZ))
        self.send(type="input_audio_buffer.commit")

    def finish_turn(self, turn_id: str, text: str = "Hi", pcm: np.ndarray | None = None) -> None:
        self.engine(StageMark(turn_id, Stage.SUBMITTED, time.monotonic()))
        self.engine(TextDelta(turn_id, text))
        if pcm is not None:
            self.engine(AudioChunk(turn_id, pcm))
        self.engine(TurnDone(turn_id, text, FinishReason.STOP, 12, 4, 3, 0 if pcm is None else pcm.size, {}))


def audio_deltas(frames: list[dict], wire_type: str = "response.output_audio.delta") -> list[np.ndarray]:
    return [b64_pcm16_samples(f["delta"]) for f in frames if f["type"] == wire_type]


def engine_pcm(seconds: float) -> np.ndarray:
    return (0.2 * np.sin(2 * np.pi * 300 * np.arange(int(seconds * ENGINE_HZ)) / ENGINE_HZ)).astype(np.float32)


def refused_then_created(h: Harness, now: float, later: float, ask: dict, code: str, param: str):
    """`response.create` of `ask` at `now` is refused with `code` naming `param` (no response, no engine turn);
    the same request at `later` runs. -> that engine request."""
    since = len(h.frames)
    h.send_at(now, type="response.create", event_id="evt_resp", response=ask)
    assert h.types(since) == ["error"] and not h.submitted()
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt_resp")
    h.send_at(later, type="response.create", response=ask)
    (request,) = h.submitted()
    return request


def user_message(*parts: dict) -> dict:
    """A client user message item of content `parts`."""
    return {"type": "message", "role": "user", "content": list(parts)}


def last_error(h: Harness) -> dict:
    return h.last("error")["error"]


def vad_harness(dialect: Dialect = Dialect.GA) -> Harness:
    h = Harness(dialect)
    fmt = PCM16K if dialect is Dialect.GA else None
    if fmt is not None:
        h.send(type="session.update", session={"type": "realtime", "audio": {"input": {"format": fmt}}})
    return h


def vad_response(h: Harness) -> str:
    h.append(silence(0.5, MODEL_HZ))
    h.append(tone(0.6, MODEL_HZ))
    h.append(silence(1.0, MODEL_HZ))
    turn_id = h.submitted()[-1].turn_id
    h.engine(TextDelta(turn_id, "Well"))
    h.engine(AudioChunk(turn_id, engine_pcm(0.2)))
    return turn_id

