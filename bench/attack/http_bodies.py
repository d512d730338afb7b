"""Weird request bodies on every HTTP route: no request a client can send may get a 5xx.

Every route of the port (health probes, models, metrics, the demo, the realtime endpoint, the voice endpoints) under
every method, with bodies a careless or hostile client sends: JSON with lone surrogates (`"\\ud800"`), control
characters, wrong types, deep nesting, huge numbers in each field; multipart with charsets that produce
surrogates (utf-7, unicode_escape), fail oddly (idna, rot13, unknown), missing boundaries and names, thousands of
parts; byte-flipped copies of valid bodies; odd Content-Length headers. Then `fuzz` seeded random mixes of them.
Acceptance: 0 answers >= 500, every request answered (status `None`: the server closed without a response or
did not answer in time) and /health still 200; a report of statuses and error codes.
"""

from __future__ import annotations

import collections
import json
import random

from .common import health_address
from .raw_http import HttpAnswer, exchange, multipart, request, voice_json, voice_wav

__all__ = ["http_bodies"]

ROUTES = ("/health", "/health/live", "/health/ready", "/v1/models", "/metrics", "/", "/index.html", "/v1/realtime",
          "/v1/realtime/voices", "/v1/realtime/voices/voice_abc", "/v1/realtime/voices/x/y", "/nope")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
VOICES = "/v1/realtime/voices"
_ODD_TEXT = ("\ud800", "a\udfffb", "\x01\x02", "x\x7f", "\u2028\u2029", "\ufeff", "\U0010ffff", "" , " ", "é" * 2000)


def _json_bodies(wav_b64: str) -> list[bytes]:
    """JSON registration bodies, each odd in one place (json.dumps writes a lone surrogate as its escape)."""
    odd = [json.dumps({"audio": wav_b64, "transcript": t}).encode() for t in _ODD_TEXT]
    odd += [json.dumps({"audio": wav_b64, "transcript": "ok", "name": t}).encode() for t in _ODD_TEXT]
    for value in (1, 1.5, True, None, [], {}, ["x"], {"a": "b"}):
        odd.append(json.dumps({"audio": wav_b64, "transcript": value}).encode())
        odd.append(json.dumps({"audio": value, "transcript": "ok"}).encode())
    odd += [b'{"audio": "' + wav_b64.encode() + b'", "transcript": "ok", "\\ud800": "x"}',
            b'{"audio": "!!", "transcript": "ok"}', b'{"audio": "' + b"A" * 7 + b'", "transcript": "ok"}',
            b"[" * 100_000, b'{"transcript": ' + b"1" * 5000 + b"}", b'{"transcript": 1e999}', b'{"transcript": NaN}',
            b'{"transcript": "a", "transcript": "b"}', b"null", b"[]", b'"x"', b"", b"\xff\xfe",
            b'{"a":"\xed\xa0\x80"}']
    return odd


def _multipart_bodies(wav: bytes) -> list[tuple[bytes, str]]:
    audio = ("audio_sample", wav, {"Content-Disposition": 'form-data; name="audio_sample"; filename="a.wav"'})
    out = []
    for charset, payload in (("utf-7", b"+2AA-"), ("unicode_escape", b"\\ud800"), ("idna", b"xn--a\x80"),
                             ("punycode", b"\xff"), ("rot13", b"x"), ("bogus", b"x"), ("utf-16", b"\x00\xd8"),
                             ("latin-1", b"\x01\x7f"), ("utf-8", b"\xed\xa0\x80")):
        out.append(multipart([audio, ("transcript", payload, {"Content-Type": f"text/plain; charset={charset}"})]))
    out.append(multipart([audio, ("transcript", b"ok", {}), ("name", b"+2D8-", {"Content-Type":
                                                                                "text/plain; charset=utf-7"})]))
    out.append(multipart([audio, ("transcript", b"ok", {"Content-Disposition": "form-data; name*=utf-8''%ED%A0%80"})]))
    out.append(multipart([audio, ("transcript", b"ok", {"Content-Disposition": "form-data"})]))
    out.append(multipart([audio, ("transcript", b"!!", {"Content-Transfer-Encoding": "base64"})]))
    out.append(multipart([("transcript", b"ok", {})] * 2000))
    body, _ = multipart([audio, ("transcript", b"ok", {})])
    out += [(body, "multipart/form-data"), (body, "multipart/form-data; boundary=other"),
            (body, "multipart/form-data; boundary=\"\ud800\"".encode("utf-8", "surrogatepass").decode("latin-1")),
            (body, "multipart/mixed; boundary=attackboundary"), (body[: len(body) // 2], "multipart/form-data; "
                                                                                         "boundary=attackboundary")]
    return out


def _flip(body: bytes, rng: random.Random) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _cases(api_key: str | None, fuzz: int, seed: int) -> list[bytes]:
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    wav = voice_wav(seconds=1.2)
    wav_b64 = voice_json("x", wav).decode().split('"audio": "')[1].split('"')[0]
    cases = []
    for route in ROUTES:  # every route, every method, a small odd body
        for method in METHODS:
            cases.append(request(method, route, headers={**auth, "Content-Type": "application/json"},
                                 body=b'{"transcript": "\\ud800"}'))
    for body in _json_bodies(wav_b64):
        cases.append(request("POST", VOICES, headers={**auth, "Content-Type": "application/json"}, body=body))
    for body, kind in _multipart_bodies(wav):
        cases.append(request("POST", VOICES, headers={**auth, "Content-Type": kind}, body=body))
    for kind in ("text/plain", "application/json; charset=utf-16", "", "application/x-www-form-urlencoded", "\x01"):
        cases.append(request("POST", VOICES, headers={**auth, "Content-Type": kind}, body=b"transcript=%ED%A0%80"))
    for length in ("abc", "-1", "99999999999999999999", "1, 2", "0x10"):
        cases.append(request("POST", VOICES, headers={**auth, "Content-Length": length}, body=b"{}", length=False))
    cases.append(request("POST", VOICES, headers={**auth, "Content-Length": "5", "Expect": "100-continue"},
                         body=b"{}{}{", length=False))
    rng = random.Random(seed)
    pool = [c for c in cases if c.startswith(b"POST " + VOICES.encode())]
    for _ in range(fuzz):
        head, _, body = rng.choice(pool).partition(b"\r\n\r\n")
        body = _flip(body, rng)
        head = b"\r\n".join(line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length"))
        cases.append(head + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return cases


async def http_bodies(url: str, *, api_key: str | None = None, fuzz: int = 500, seed: int = 0,
                      timeout_s: float = 30.0) -> dict:
    """Send every case (one connection each, one at a time) and count the answers."""
    host, port = health_address(url)
    statuses: collections.Counter = collections.Counter()
    codes: collections.Counter = collections.Counter()
    server_errors, unanswered = [], []
    cases = _cases(api_key, fuzz, seed)
    for raw in cases:
        answer: HttpAnswer = await exchange(host, port, raw, timeout_s)
        statuses[str(answer.status)] += 1
        if answer.code:
            codes[answer.code] += 1
        if answer.status is None:
            unanswered.append(raw[:120].decode("latin-1"))
        elif answer.status >= 500:
            server_errors.append((raw[:120].decode("latin-1"), answer.status, answer.body[:200].decode("latin-1")))
    health = await exchange(host, port, request("GET", "/health"))
    report = {"requests": len(cases), "statuses": dict(sorted(statuses.items())), "codes": dict(codes.most_common()),
              "http_5xx": len(server_errors), "examples_5xx": server_errors[:5], "unanswered": len(unanswered),
              "examples_unanswered": unanswered[:5], "health_after": health.status}
    report["ok"] = not server_errors and not unanswered and health.status == 200
    return report
