"""Input audio transcription by Ming's own ASR (`audio.input.transcription`, beta `input_audio_transcription`).

Every committed user audio item gets one side turn in the engine (`TurnTask.TRANSCRIBE`: text only, no
talker, greedy) whose text streams out as `conversation.item.input_audio_transcription.delta` events and
ends with `.completed` (the transcript is then stored on the item, so `conversation.item.retrieve` shows
it) or `.failed` (with the engine's failure code).

Two prompt layouts, both with the reference's ASR instruction (inclusionAI/Ming `README.md`, "Audio tasks"
→ ASR, and `ming_sdk/ming.py`):

* **shared** (the item is the user turn of a reply: a VAD turn that responds, a speculative turn): the reply's
  own prompt — its system turn (instructions, tools), the earlier conversation and the user's audio turn —
  with the instruction following the audio in that same HUMAN turn::

      …<role>HUMAN</role><audio>…</audio>Please recognize the language of this speech and transcribe it.
      Format: oral.<|role_end|><role>ASSISTANT</role>

  Everything up to the end of the audio is token for token the reply's prompt, so the side request
  (`TurnRequest.prefix_from`) starts from a copy of the K/V the reply already prefilled (speculatively, while
  the user was still pausing; `KVSlotManager.fork`) and prefills only the instruction (~20 tokens): no second
  audio encoding, no second prefill of the conversation.
* **reference** (no reply shares the audio: manual commits without a response yet, `transcription`-type
  sessions): the reference's exact prompt, one HUMAN turn holding the instruction and then the audio after
  the processor's default system turn::

      <role>HUMAN</role>Please recognize the language of this speech and transcribe it. Format: oral.<audio>…</audio>

Fidelity of the shared layout: the K/V of the audio depends on everything before it, so only a prompt in
which the audio comes before the instruction can reuse the reply's prefill. The audio-first order is the
one vLLM-Omni's Ming-flash-omni 2.0 example uses for the same instruction (its `use_audio` query: audio, then
"Please recognize … Format: oral."), and Ming's ASR is context-aware: the earlier conversation and the
session's instructions are context it is trained to use (names, terms), the instruction being the last
thing the model reads before it answers. What differs from the reference is that context (a persona system
prompt could in principle pull the model towards answering instead of transcribing) and the order;
transcripts of the shared layout are the model's own greedy output over that prompt, identical to
prefilling the same prompt from scratch (tests/test_transcription_kv.py).

Context (Ming's context-aware ASR takes hotwords or preceding text as plain text in the same turn):

* `prompt` is put before the instruction as `Context: {prompt}\\n` (free text: vocabulary, names, the
  previous dialogue), and `keywords` as `Hotwords: {a}, {b}\\n` (terms to spell as given);
* `language` (ISO-639-1, e.g. `en`) replaces "recognize the language of this speech" by "The speech is in
  {English}." so the model does not have to identify it; `languages` (possible ones) by "The speech is in
  {English} or {Chinese}."; unknown codes are passed as given.

The transcription turn has its own KV slot (`<conversation>_asr`), so the reply's cached prefix is never
evicted by it (and the slot is freed after each transcription); in the shared layout that slot starts as a
device-side copy of the reply slot's shared prefix. It never delays the reply's first audio: the session
holds it (`start`) while a reply to the same input has not sent its first audio (or text) yet, and submits
it (`release`) at that moment, when the reply ends, or at once when no reply is coming; in the engine a side
request is admitted only once the reply's prompt is prefilled, and its prefill queues behind every reply's
(`TurnTask.TRANSCRIBE`).

GA `transcription`-type sessions (`session.type: "transcription"`) run only this: server VAD turns (or
`input_audio_buffer.commit`) become user audio items that are transcribed, and no response is ever created
(`response.create` -> `transcription_session_no_response`; realtime-only fields -> `realtime_only_parameter`).

`model`: any transcription model name the OpenAI types allow (except `gpt-4o-transcribe-diarize`, whose
speaker labels Ming does not produce) and the served model's own name are accepted; all run Ming's ASR,
and the session reports the served model's name as the transcription model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from ..engine.api import (
    Content,
    ContentKind,
    FailureCode,
    Message,
    SamplingParams,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnRequest,
    TurnTask,
)
from ..protocol.audio_input import InputTranscription
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import InputAudio, MessageItem
from ..protocol.responses import ErrorDetail, TranscriptionTokenUsage
from ..protocol.server_events import (
    ConversationItemInputAudioTranscriptionCompleted,
    ConversationItemInputAudioTranscriptionDelta,
    ConversationItemInputAudioTranscriptionFailed,
)
from ..protocol.session import SessionConfig, SessionType
from .actions import Action, CancelTurn, CloseConversation, Send, SubmitTurn
from .conversation import Conversation, StoredItem
from .response import ActiveResponse

__all__ = [
    "ASR_INSTRUCTION",
    "OPENAI_TRANSCRIPTION_MODELS",
    "Transcriber",
    "asr_followup",
    "asr_instruction",
    "asr_message",
    "check_transcription",
    "transcription_session_defaults",
]

# The reference's ASR instruction (inclusionAI/Ming README.md "Audio tasks": ASR).
ASR_INSTRUCTION: Final = "Please recognize the language of this speech and transcribe it. Format: oral."
_LANGUAGE_INSTRUCTION: Final = "The speech is in {language}. Please transcribe it. Format: oral."

# The `model` literals of the openai package's `AudioTranscription` that Ming's ASR can stand in for.
OPENAI_TRANSCRIPTION_MODELS: Final = (
    "whisper-1",
    "gpt-transcribe",
    "gpt-live-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-4o-transcribe",
    "gpt-realtime-whisper",
)
_UNSUPPORTED_MODELS: Final = {"gpt-4o-transcribe-diarize": "Ming's ASR gives no speaker labels (diarization)"}

_LANGUAGES: Final = {
    "en": "English", "zh": "Chinese", "yue": "Cantonese", "ja": "Japanese", "ko": "Korean", "fr": "French",
    "de": "German", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "ru": "Russian", "ar": "Arabic",
    "hi": "Hindi", "nl": "Dutch", "th": "Thai", "vi": "Vietnamese", "id": "Indonesian", "tr": "Turkish",
}

# Ming's transcript of one committed turn is short; a runaway generation ends here (finish `length`).
MAX_TRANSCRIPT_TOKENS: Final = 448

_FAILURE_TEXT: Final = {
    FailureCode.ENGINE_BUSY: "the model engine is at capacity; the audio was not transcribed",
    FailureCode.INVALID_PROMPT: "the audio cannot be transcribed",
    FailureCode.ENGINE_UNAVAILABLE: "the model engine is unavailable",
    FailureCode.SHUTTING_DOWN: "the server is shutting down",
}


def check_transcription(value: InputTranscription | None, served_model: str, param: str) -> InputTranscription | None:
    """The transcription setting as the session keeps and reports it: `model` names what runs (the served
    model). Raises `ProtocolError` (`unsupported_transcription_model`) for a model Ming cannot stand in for."""
    if value is None:
        return None
    model = value.model
    if model is not None and model != served_model and model not in OPENAI_TRANSCRIPTION_MODELS:
        reason = _UNSUPPORTED_MODELS.get(model, "it is not a transcription model this server knows")
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_TRANSCRIPTION_MODEL, param=f"{param}.model", model=model, reason=reason,
            supported=", ".join((served_model, *OPENAI_TRANSCRIPTION_MODELS)),
        )
    return replace(value, model=served_model)


def transcription_session_defaults(config: SessionConfig, served_model: str) -> SessionConfig:
    """`config` on becoming a GA `transcription` session: its transcription is on (the served model's ASR
    unless the update set one), since transcribing committed audio is all such a session does."""
    if config.session_type is SessionType.TRANSCRIPTION and config.transcription is None:
        return replace(config, transcription=InputTranscription(model=served_model))
    return config


def asr_instruction(setting: InputTranscription) -> str:
    """The ASR instruction with `prompt`, `keywords` and `language(s)` as context (module doc)."""
    codes = (setting.language,) if setting.language else setting.languages
    if codes:
        names = " or ".join(_LANGUAGES.get(code.lower(), code) for code in codes)
        instruction = _LANGUAGE_INSTRUCTION.format(language=names)
    else:
        instruction = ASR_INSTRUCTION
    if setting.keywords:
        instruction = f"Hotwords: {', '.join(setting.keywords)}\n{instruction}"
    if setting.prompt:
        instruction = f"Context: {setting.prompt}\n{instruction}"
    return instruction


def asr_message(audio: Content, setting: InputTranscription) -> Message:
    """The reference layout: one user turn, the instruction and then `audio` (module doc)."""
    return Message("user", (Content.of_text(asr_instruction(setting)), audio))


def asr_followup(history: tuple[Message, ...], audio: Content, setting: InputTranscription) -> tuple[Message, ...] | None:
    """The shared layout: `history` (a reply's, ending with the user turn that holds `audio`) with the instruction
    following that turn's content; None when `history` does not end with that audio."""
    if not history or history[-1].role != "user" or not any(_same_audio(c, audio) for c in history[-1].content):
        return None
    last = history[-1]
    return history[:-1] + (Message("user", last.content + (Content.of_text(asr_instruction(setting)),)),)


def _same_audio(part: Content, audio: Content) -> bool:
    if part.kind is not ContentKind.AUDIO or part.sample_rate_hz != audio.sample_rate_hz:
        return False
    return part.audio is audio.audio or (part.audio.shape == audio.audio.shape
                                         and bool(np.array_equal(part.audio, audio.audio)))


@dataclass
class _Job:
    item_id: str
    content_index: int
    text: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Held:
    """A transcription not submitted yet: its request is built at `release` (the reply's prompt is known then)."""

    turn_id: str
    audio: Content
    setting: InputTranscription


class Transcriber:
    """The transcription side turns of one session: submit at commit, route engine events, store results."""

    def __init__(self, conversation: Conversation, conversation_id: str) -> None:
        self._conversation = conversation
        self.conversation_id = conversation_id + "_asr"
        self._jobs: dict[str, _Job] = {}
        self._pending: list[_Held] = []  # held until the reply's first output (module doc)
        self._reply: TurnRequest | None = None  # the newest reply turn of the conversation (shared layout)
        self._first_output_of: str | None = None  # the reply whose first output was seen (`release`)
        self._used = False

    def note_reply(self, request: TurnRequest) -> None:
        """A reply turn of the conversation was submitted (speculative or not): a transcription of the audio its
        prompt ends with reuses that prompt's prefix."""
        self._reply = request

    def owns(self, turn_id: str) -> bool:
        """Whether `turn_id` is one of this session's transcription turns."""
        return turn_id in self._jobs

    @property
    def has_pending(self) -> bool:
        """Whether transcriptions wait for `release`."""
        return bool(self._pending)

    def release(self, reply: ActiveResponse | None) -> list[Action]:
        """Submit the held transcriptions, oldest first, unless `reply` (the active response) has not sent its
        first audio (text, for a text reply) yet, or sent it just now: the transcription is submitted on the next
        event, after that first output went out, so it never delays a reply's first output (not even by the
        engine and input work it starts while the first delta is still being written)."""
        if reply is not None:
            if reply.first_audio_at is None if reply.spec.is_audio else not reply.item.text:
                return []
            if self._first_output_of != reply.id:  # the call that produced the first output
                self._first_output_of = reply.id
                return []
        pending, self._pending = self._pending, []
        return [SubmitTurn(self._request(held)) for held in pending]

    def _request(self, held: _Held) -> TurnRequest:
        """The side turn of `held`: the shared layout when the newest reply's prompt ends with its audio, else the
        reference layout (module doc)."""
        reply = self._reply
        history = asr_followup(reply.history, held.audio, held.setting) if reply is not None else None
        common = dict(turn_id=held.turn_id, conversation_id=self.conversation_id, with_audio=False,
                      sampling=SamplingParams(temperature=0.0, max_tokens=MAX_TRANSCRIPT_TOKENS),
                      task=TurnTask.TRANSCRIBE)
        if history is None:
            return TurnRequest(history=(asr_message(held.audio, held.setting),), **common)
        return TurnRequest(history=history, system=reply.system, tools=reply.tools, truncation=reply.truncation,
                           prefix_from=reply.conversation_id, **common)

    def start(self, item_id: str, content_index: int, audio: Content, setting: InputTranscription) -> None:
        """Prepare the transcription of `audio` (part `content_index` of user item `item_id`); it is held
        until `release`."""
        turn_id = new_id(IdPrefix.RESPONSE)
        self._jobs[turn_id] = _Job(item_id, content_index)
        self._used = True
        self._pending.append(_Held(turn_id, audio, setting))

    def on_engine_event(self, event: TurnEvent) -> list[Action]:
        """Apply one engine event of a transcription turn (see `owns`)."""
        job = self._jobs.get(event.turn_id)
        if job is None or isinstance(event, StageMark):
            return []
        if isinstance(event, TextDelta):
            if not event.text:
                return []
            job.text.append(event.text)
            return [Send(ConversationItemInputAudioTranscriptionDelta(
                item_id=job.item_id, content_index=job.content_index, delta=event.text))]
        del self._jobs[event.turn_id]
        # Each ASR prompt is a fresh turn (nothing worth keeping cached): its slot goes back to the free pool at
        # once, so it never evicts another conversation's cached prefix.
        return self._finish(job, event) + [CloseConversation(self.conversation_id)]

    def _finish(self, job: _Job, event: TurnEvent) -> list[Action]:
        if isinstance(event, TurnDone):
            transcript = "".join(job.text).strip()
            self._store(job, transcript)
            usage = TranscriptionTokenUsage(input_tokens=event.prompt_tokens, output_tokens=event.output_tokens)
            return [Send(ConversationItemInputAudioTranscriptionCompleted(
                item_id=job.item_id, content_index=job.content_index, transcript=transcript, usage=usage))]
        if isinstance(event, TurnCancelled):  # only the session cancels (item deleted, session closed)
            return []
        assert isinstance(event, TurnFailed)
        code = ErrorCode.TRANSCRIPTION_FAILED
        reason = _FAILURE_TEXT.get(event.code, "the model engine failed while transcribing")
        error = ErrorDetail(type=code.error_type.value, code=code.value,
                            message=code.render(item_id=job.item_id, reason=reason))
        return [Send(ConversationItemInputAudioTranscriptionFailed(
            item_id=job.item_id, content_index=job.content_index, error=error))]

    def forget_item(self, item_id: str) -> list[Action]:
        """The item was deleted: stop transcribing it."""
        gone = [t for t, job in self._jobs.items() if job.item_id == item_id]
        for turn_id in gone:
            del self._jobs[turn_id]
        held = {r.turn_id for r in self._pending}
        self._pending = [r for r in self._pending if r.turn_id not in gone]
        return [CancelTurn(t) for t in gone if t not in held]

    def close(self) -> list[Action]:
        """Session end: cancel every running transcription and free the ASR slot."""
        held = {r.turn_id for r in self._pending}
        actions: list[Action] = [CancelTurn(t) for t in self._jobs if t not in held]
        self._jobs.clear()
        self._pending.clear()
        if self._used:
            actions.append(CloseConversation(self.conversation_id))
        return actions

    def _store(self, job: _Job, transcript: str) -> None:
        entry = self._conversation.get(job.item_id)
        if not isinstance(entry, StoredItem) or not isinstance(entry.item, MessageItem):
            return  # deleted (or evicted) meanwhile: the events still report what was heard
        parts = list(entry.item.content)
        if job.content_index < len(parts) and isinstance(parts[job.content_index], InputAudio):
            parts[job.content_index] = replace(parts[job.content_index], transcript=transcript)
            entry.item = replace(entry.item, content=tuple(parts))
