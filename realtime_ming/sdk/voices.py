"""Cloned voices over HTTP: `register_voice`, `list_voices`, `delete_voice` (`/v1/realtime/voices`).

    voice = await register_voice("ws://host:8000", "me.wav", "The words I say in the clip.", api_key=key)
    await client.update_session(voice=voice.id)   # GA: sent as {"id": "voice_..."}

`audio` is a path, the bytes of an audio file (WAV, FLAC, OGG), or float samples with `sample_rate`
(written as 16-bit WAV). The server computes the voice once; it belongs to `api_key`. Refusals raise
`VoiceError` (status, code, param and the server's message); 401/403 raise `AuthenticationError`.
The HTTP calls run on a worker thread (stdlib `urllib`), never blocking the event loop.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from .errors import AuthenticationError, RealtimeError

__all__ = ["RegisteredVoice", "VoiceError", "delete_voice", "list_voices", "register_voice", "voices_url"]


class VoiceError(RealtimeError):
    """The server refused a voice request: HTTP `status`, error `code`, `param` and message."""

    def __init__(self, status: int, code: str | None, message: str, param: str | None = None) -> None:
        super().__init__(f"HTTP {status} {code or ''}: {message}".strip())
        self.status, self.code, self.param = status, code, param


@dataclass(frozen=True, slots=True)
class RegisteredVoice:
    """A voice on the server (`audio.voice`): use `id` as the session's or a response's voice."""

    id: str
    name: str
    created_at: int
    duration_s: float | None = None
    transcript: str | None = None

    @classmethod
    def from_json(cls, data: dict) -> RegisteredVoice:
        return cls(data["id"], data.get("name", data["id"]), int(data.get("created_at", 0)),
                   data.get("duration_s"), data.get("transcript"))


def voices_url(url: str) -> str:
    """`http(s)://host[:port]/v1/realtime/voices` for a server URL (ws, wss, http or https, any path)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use ws://, wss://, http:// or https://)")
    return urlunsplit((scheme, parts.netloc, "/v1/realtime/voices", "", ""))


def _audio_file(audio: str | os.PathLike | bytes | np.ndarray, sample_rate: int | None) -> bytes:
    if isinstance(audio, (bytes, bytearray)):
        return bytes(audio)
    if isinstance(audio, np.ndarray):
        if sample_rate is None:
            raise ValueError("sample_rate is required for audio samples")
        import soundfile

        buf = io.BytesIO()
        soundfile.write(buf, np.asarray(audio, dtype=np.float32), sample_rate, subtype="PCM_16", format="WAV")
        return buf.getvalue()
    with open(audio, "rb") as f:
        return f.read()


def _multipart(fields: dict[str, str], file_field: str, file_bytes: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for key, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n'
                     f"Content-Type: text/plain; charset=utf-8\r\n\r\n{value}\r\n".encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="voice.wav"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + file_bytes + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _call(method: str, url: str, api_key: str | None, body: bytes | None = None, content_type: str | None = None,
          timeout_s: float = 60.0) -> dict:
    request = urllib.request.Request(url, data=body, method=method)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (http(s) only)
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        if exc.code in (401, 403):
            raise AuthenticationError(exc.code, text) from None
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            raise VoiceError(exc.code, None, text or exc.reason) from None
        raise VoiceError(exc.code, error.get("code"), error.get("message", ""), error.get("param")) from None


async def register_voice(url: str, audio: str | os.PathLike | bytes | np.ndarray, transcript: str, *,
                         name: str | None = None, api_key: str | None = None, sample_rate: int | None = None,
                         timeout_s: float = 60.0) -> RegisteredVoice:
    """Register a voice from `audio` and its exact `transcript`; returns it (use `.id` as the voice)."""
    if not transcript or not transcript.strip():
        raise ValueError("transcript must be the words spoken in the audio")
    fields = {"transcript": transcript} | ({"name": name} if name else {})
    body, content_type = _multipart(fields, "audio_sample", _audio_file(audio, sample_rate))
    data = await asyncio.to_thread(_call, "POST", voices_url(url), api_key, body, content_type, timeout_s)
    return RegisteredVoice.from_json(data)


async def list_voices(url: str, *, api_key: str | None = None) -> list[RegisteredVoice]:
    """The voices registered with `api_key`."""
    data = await asyncio.to_thread(_call, "GET", voices_url(url), api_key)
    return [RegisteredVoice.from_json(v) for v in data.get("data", [])]


async def delete_voice(url: str, voice_id: str, *, api_key: str | None = None) -> None:
    """Delete a voice (VoiceError 404 `voice_not_found` when `api_key` has none of that id)."""
    await asyncio.to_thread(_call, "DELETE", f"{voices_url(url)}/{voice_id}", api_key)
