"""Telling a frame without media from its text (protocol/media_scan.py, issue 43): the scan never says "no media"
of a frame whose decoded value carries media (a media key with a string value, however it is written), says "no"
of the frames clients send without media, and gives the same answer a read at a time, whatever the reads'
boundaries."""

from __future__ import annotations

import json
import random

import pytest

from realtime_ming.protocol.media_scan import MEDIA_KEYS, MediaScan, carries_media, may_carry_media

PNG = "data:image/png;base64,iVBORw0KGgo="
TOOLS = [{"type": "function", "name": f"t{i}", "description": "uses audio and image_url " * 20,
          "parameters": {"type": "object", "properties": {"audio": {"type": "string"}}}} for i in range(3)]


def _create(*parts: dict, **response) -> str:
    items = [{"type": "message", "role": "user", "content": list(parts)}] if parts else []
    return json.dumps({"type": "response.create", "response": {"tools": TOOLS, **response, "input": items}})


WITH_MEDIA = [
    _create({"type": "input_audio", "audio": "AAAA"}),
    _create({"type": "input_image", "image_url": PNG}),
    _create({"type": "input_video", "frames": [{"image_url": PNG, "timestamp_s": 0}]}),
    _create({"type": "input_video", "video_url": "data:video/mp4;base64,AAAA"}),
    json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"}),
    _create({"type": "input_image", "image_url": PNG}).replace('"image_url"', '"image\\u005furl"'),  # escaped
    _create({"type": "input_audio", "audio": "AAAA"}).replace('"audio": "AAAA"', '"\\u0061udio": "AAAA"'),
    _create({"type": "input_audio", "audio": "AAAA"}).replace('"audio": ', '"audio"' + " " * 64 + ":" + "\n" * 64),
    _create({"type": "input_audio", "audio": "AAAA"}).replace('"audio": ', '"audio"' + " " * 300 + ": "),
    _create({"type": "input_audio", "audio": "AAAA"}).replace('"audio": ', '"audio":' + "\t" * 300),
    json.dumps({"type": "response.create", "response": {"metadata": {"audio": "x"}}}),  # a media key: "may"
]
WITHOUT_MEDIA = [
    _create({"type": "input_text", "text": "describe the audio"}),
    _create(output_modalities=["text", "audio"], audio={"output": {"voice": "alloy", "format": {"type": "audio/pcm"}}}),
    _create({"type": "input_audio", "transcript": "only a transcript", "audio": None}),
    _create({"type": "input_text", "text": 'a "quoted" \\"audio\\": \\"x\\" key é 漢'}),
    json.dumps({"type": "response.create", "response": {"instructions": "é漢😀 " * 50}}),  # \u00e9 \u6f22: no key
    json.dumps({"type": "response.create", "response": {"instructions": "é漢😀 " * 50}}, ensure_ascii=False),
    json.dumps({"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "audio"}]}}),
]


@pytest.mark.parametrize("frame", WITH_MEDIA, ids=[f"media{i}" for i in range(len(WITH_MEDIA))])
def test_a_frame_with_media_may_carry_it(frame: str) -> None:
    assert may_carry_media(frame) and _scanned(frame.encode(), [len(frame)])


@pytest.mark.parametrize("frame", WITHOUT_MEDIA, ids=[f"none{i}" for i in range(len(WITHOUT_MEDIA))])
def test_what_clients_send_without_media_is_told_without_decoding(frame: str) -> None:
    assert not carries_media(json.loads(frame))
    assert not may_carry_media(frame) and not _scanned(frame.encode(), [len(frame)])


def test_an_escape_of_printable_ascii_is_a_may() -> None:
    """Any `\\u0020`..`\\u007f` could spell a key: the scan says "may", decoding decides (here: no media)."""
    frame = json.dumps({"type": "response.create", "response": {"instructions": "a\\u0041b"}}).replace("\\\\", "\\")
    assert json.loads(frame)["response"]["instructions"] == "aAb"
    assert may_carry_media(frame) and not carries_media(json.loads(frame))


def _scanned(data: bytes, sizes: list[int]) -> bool:
    """`MediaScan` fed the growing buffer in reads of `sizes` (cycled)."""
    scan, buffer, k = MediaScan(), bytearray(), 0
    while len(buffer) < len(data):
        buffer += data[len(buffer):len(buffer) + sizes[k % len(sizes)]]
        scan.feed(buffer, len(buffer))
        k += 1
    return scan.found


@pytest.mark.parametrize("sizes", [[1], [2], [3], [5, 7], [140], [141, 1], [4096]])
def test_a_key_split_across_reads_is_found(sizes: list[int]) -> None:
    """Every frame, every boundary (reads of 1, 2, 3... bytes and around one match's length): the same answer."""
    for frame in WITH_MEDIA + WITHOUT_MEDIA:
        assert _scanned(frame.encode(), sizes) == may_carry_media(frame), (sizes, frame[:80])


def test_the_scan_never_misses_media_a_decoder_finds() -> None:
    """Random JSON with media keys and near misses at random depths, keys and whitespace written at random:
    whenever the decoded value carries media, both scans say it may."""
    rng = random.Random(43)
    names = [*MEDIA_KEYS, "audi", "image", "url", "xaudio", "type", "text", "audio_url"]

    def value(depth: int):
        kind = rng.random()
        if depth > 3 or kind < 0.35:
            return rng.choice(["AAAA", "audio", "", 7, None, True, "\\u0061", "é"])
        if kind < 0.55:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(names): value(depth + 1) for _ in range(rng.randint(0, 3))}

    def write(node) -> str:
        ws = lambda: rng.choice(["", " ", "\n\t", " " * rng.randint(0, 150)])  # noqa: E731
        if isinstance(node, dict):
            pairs = [f"{ws()}{key_text(k)}{ws()}:{ws()}{write(v)}" for k, v in node.items()]
            return "{" + ",".join(pairs) + ws() + "}"
        if isinstance(node, list):
            return "[" + ",".join(ws() + write(v) for v in node) + "]"
        return json.dumps(node, ensure_ascii=rng.random() < 0.5)

    def key_text(key: str) -> str:
        if rng.random() < 0.2:  # a letter written as an escape
            i = rng.randrange(len(key))
            return '"' + key[:i] + f"\\u{ord(key[i]):04x}" + key[i + 1:] + '"'
        return json.dumps(key)

    seen = 0
    for _ in range(3000):
        text = write({"type": "response.create", "response": value(0)})
        decoded = json.loads(text)
        if carries_media(decoded):
            seen += 1
            assert may_carry_media(text), text
            assert _scanned(text.encode(), [rng.randint(1, 200)]), text
    assert seen > 300
