"""Raw HTTP/1.1 over asyncio streams for the attack drivers: any bytes on the wire, one request per connection."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from dataclasses import dataclass

import numpy as np

__all__ = ["HttpAnswer", "exchange", "multipart", "request", "voice_json", "voice_wav"]


@dataclass(frozen=True)
class HttpAnswer:
    """A response (status None: the server closed the connection without one, or `timeout_s` passed)."""

    status: int | None
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        try:
            data = json.loads(self.body)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def code(self) -> str | None:
        """`error.code` of a JSON error body."""
        error = self.json().get("error")
        return error.get("code") if isinstance(error, dict) else None


def request(method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
            length: bool = True) -> bytes:
    """The bytes of one request (`Content-Length` from `body` unless `length` is False or headers set it)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    given = {k.lower() for k in (headers or {})}
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    if length and "content-length" not in given and (body or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1", "replace") + b"\r\n\r\n" + body


async def exchange(host: str, port: int, raw: bytes, timeout_s: float = 30.0) -> HttpAnswer:
    """Send `raw` and read the response (an interim 100 Continue skipped)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            return await _response(reader)
    except TimeoutError:
        return HttpAnswer(None, {}, b"")
    finally:
        writer.close()


async def _response(reader: asyncio.StreamReader) -> HttpAnswer:
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = await reader.read(65536)
            if not chunk:
                return HttpAnswer(None, {}, data)
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        if status != 100:
            break
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    want = int(headers.get("content-length", "0") or 0)
    while len(data) < want:
        chunk = await reader.read(65536)
        if not chunk:
            break
        data += chunk
    return HttpAnswer(status, headers, data)


def multipart(fields: list[tuple[str, bytes, dict[str, str]]], boundary: str = "attackboundary") -> tuple[bytes, str]:
    """(body, content type) of multipart/form-data; each field: (name, payload, extra part headers)."""
    out = io.BytesIO()
    for name, payload, extra in fields:
        out.write(f"--{boundary}\r\n".encode())
        disposition = extra.get("Content-Disposition", f'form-data; name="{name}"')
        out.write(f"Content-Disposition: {disposition}\r\n".encode("latin-1", "replace"))
        for key, value in extra.items():
            if key != "Content-Disposition":
                out.write(f"{key}: {value}\r\n".encode("latin-1", "replace"))
        out.write(b"\r\n" + payload + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def voice_wav(seconds: float = 2.0, rate_hz: int = 16000, seed: int = 0) -> bytes:
    """A voice-like WAV (a gliding harmonic tone with noise): passes the upload checks (not silent, in range)."""
    import soundfile

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate_hz
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + rng.standard_normal(t.size) * 0.01
    buf = io.BytesIO()
    soundfile.write(buf, x.astype(np.float32), rate_hz, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def voice_json(transcript: str, wav: bytes) -> bytes:
    """A JSON registration body."""
    return json.dumps({"audio": base64.b64encode(wav).decode(), "transcript": transcript}).encode()
