"""Parsing and validating a voice-cloning upload (`POST /v1/realtime/voices`): no model work here.

Two request shapes:
* `multipart/form-data`: `audio_sample` (the file; `audio` also accepted), `transcript`, optional `name`;
* `application/json`: `{"audio": "<base64 audio file>", "transcript": ..., "name": ...}` (`audio_sample`
  also accepted for the audio).
The audio is any file libsndfile reads (WAV, FLAC, OGG/Vorbis, ...). Its header is checked before
decoding (sample rate, channels, duration within `server.voices` limits), the samples after (finite,
not silent); stereo is mixed down to mono. Every problem is a `VoiceUploadError` carrying the HTTP
status and an OpenAI-style error object (`type`, `code`, `message`, `param`).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass

import numpy as np
import soundfile

from ..protocol.limits import text_problem
from .config import VoicesConfig
from .http_body import BodyError, form_parts

__all__ = ["VoiceUpload", "VoiceUploadError", "decode_audio", "parse_upload"]

_AUDIO_FIELDS = ("audio_sample", "audio")
_FIELDS = frozenset((*_AUDIO_FIELDS, "transcript", "name"))
_SILENT_PEAK = 1e-4  # a clip whose loudest sample is below this holds no voice


class VoiceUploadError(Exception):
    """A refused upload: HTTP `status` and the error object of the JSON body."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"type": kind, "code": self.code, "message": self.message, "param": self.param}}


@dataclass(frozen=True)
class VoiceUpload:
    """The fields of an upload, before the audio is decoded."""

    audio: bytes
    transcript: str
    name: str | None


@dataclass(frozen=True)
class DecodedAudio:
    samples: np.ndarray  # float32 mono [n]
    rate_hz: int
    duration_s: float


def _bad(code: str, message: str, param: str | None = None) -> VoiceUploadError:
    return VoiceUploadError(400, code, message, param)


def _form_fields(body: bytes, content_type: str) -> dict[str, list[bytes | str]]:
    """Fields of a multipart/form-data body: name -> values (bytes for files, str for text)."""
    try:
        parts = form_parts(body, content_type)
    except BodyError as exc:
        raise _bad("invalid_multipart", exc.message) from None
    fields: dict[str, list[bytes | str]] = {}
    for part in parts:
        if part.filename is not None or part.name in _AUDIO_FIELDS:
            fields.setdefault(part.name, []).append(part.payload)
            continue
        try:
            fields.setdefault(part.name, []).append(part.text())
        except BodyError:
            raise _bad("invalid_value", f"The form field {part.name!r} is not valid {part.charset[:40]!r} text.",
                       part.name) from None
    return fields


def _json_fields(body: bytes) -> dict[str, list[bytes | str]]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise _bad("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise _bad("invalid_json", "The request body must be a JSON object.")
    fields: dict[str, list[bytes | str]] = {}
    for key, value in data.items():
        if value is None and key == "name":
            continue
        if not isinstance(value, str):
            raise _bad("invalid_type", f"{key!r} must be a string.", key)
        if key in _AUDIO_FIELDS:
            try:
                fields[key] = [base64.b64decode(value, validate=True)]
            except (binascii.Error, ValueError):
                raise _bad("invalid_base64", f"{key!r} is not valid base64.", key) from None
        else:
            fields[key] = [value]
    return fields


def _text(fields: dict, name: str, limit: int, *, required: bool) -> str | None:
    values = fields.get(name, [])
    if len(values) > 1:
        raise _bad("duplicate_parameter", f"{name!r} was given more than once.", name)
    value = values[0].strip() if values else ""
    if not value:
        if required:
            raise _bad("missing_transcript" if name == "transcript" else "missing_required_parameter",
                       f"{name!r} is required: the exact words spoken in the audio sample." if name == "transcript"
                       else f"{name!r} is required.", name)
        return None
    problem = text_problem(value)  # a lone surrogate (JSON "\ud800", charset=utf-7) or a C0 control
    if problem is not None or "\x7f" in value:
        raise _bad("invalid_text", f"{name!r} holds {problem or 'a DEL character'}; send plain UTF-8 text.", name)
    if len(value) > limit:
        raise _bad(f"{name}_too_long", f"{name!r} is {len(value)} characters; at most {limit} are accepted.", name)
    return " ".join(value.split())


def parse_upload(body: bytes, content_type: str | None, cfg: VoicesConfig) -> VoiceUpload:
    """The fields of a request body; raises VoiceUploadError (400/415)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        fields = _form_fields(body, content_type or "")
    elif kind == "application/json":
        fields = _json_fields(body)
    else:
        raise VoiceUploadError(415, "unsupported_content_type",
                               "Send multipart/form-data (audio_sample, transcript, name) or application/json "
                               "(audio as base64, transcript, name).")
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise _bad("unknown_parameter", f"Unknown parameter {unknown[0]!r}; accepted: audio_sample (or audio), "
                   "transcript, name.", unknown[0])
    audio = [(k, v) for k in _AUDIO_FIELDS for v in fields.get(k, [])]
    if not audio:
        raise _bad("missing_audio", "An audio sample is required (audio_sample).", "audio_sample")
    if len(audio) > 1:
        raise _bad("duplicate_parameter", "Send exactly one audio sample.", audio[1][0])
    raw = audio[0][1]
    if not isinstance(raw, bytes) or not raw:
        raise _bad("invalid_audio", "The audio sample is empty.", audio[0][0])
    transcript = _text(fields, "transcript", cfg.max_transcript_chars, required=True)
    name = _text(fields, "name", cfg.max_name_chars, required=False)
    assert transcript is not None
    return VoiceUpload(raw, transcript, name)


def decode_audio(data: bytes, cfg: VoicesConfig) -> DecodedAudio:
    """Decode and check an audio file (CPU work: call it off the event loop); raises VoiceUploadError."""
    param = "audio_sample"
    try:
        info = soundfile.info(io.BytesIO(data))
    except (RuntimeError, ValueError, TypeError, EOFError) as exc:  # libsndfile: unknown or corrupt file
        raise _bad("invalid_audio", f"The audio sample could not be read as an audio file ({_short(exc)}).",
                   param) from None
    rate, channels, frames = int(info.samplerate), int(info.channels), int(info.frames)
    if not cfg.min_sample_rate_hz <= rate <= cfg.max_sample_rate_hz:
        raise _bad("unsupported_sample_rate", f"Sample rate {rate} Hz is outside "
                   f"{cfg.min_sample_rate_hz}-{cfg.max_sample_rate_hz} Hz.", param)
    if not 1 <= channels <= cfg.max_channels:
        raise _bad("unsupported_channels", f"{channels} channels; 1 to {cfg.max_channels} are accepted.", param)
    duration = frames / rate if 0 < frames < 2**62 else 0.0
    _check_duration(duration, cfg)
    try:
        wav, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True, frames=frames)
    except (RuntimeError, ValueError, TypeError, EOFError) as exc:
        raise _bad("invalid_audio", f"The audio sample could not be decoded ({_short(exc)}).", param) from None
    _check_duration(wav.shape[0] / rate, cfg)  # a header may claim more frames than the file holds
    samples = np.ascontiguousarray(wav.mean(axis=1), dtype=np.float32)
    if not np.isfinite(samples).all():
        raise _bad("invalid_audio", "The audio sample holds non-finite values.", param)
    if float(np.abs(samples).max()) < _SILENT_PEAK:
        raise _bad("audio_silent", "The audio sample is silent.", param)
    return DecodedAudio(samples, rate, samples.shape[0] / rate)


def _check_duration(duration: float, cfg: VoicesConfig) -> None:
    if duration < cfg.min_duration_s:
        raise _bad("audio_too_short", f"The audio sample lasts {duration:.2f} s; at least {cfg.min_duration_s:g} s "
                   "is needed.", "audio_sample")
    if duration > cfg.max_duration_s:
        raise _bad("audio_too_long", f"The audio sample lasts {duration:.2f} s; at most {cfg.max_duration_s:g} s "
                   "is accepted.", "audio_sample")


def _short(exc: Exception) -> str:
    """libsndfile's reason without the file object's repr ("Error opening <_io.BytesIO ...>: reason")."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.rpartition(">: ")[2][:160]
