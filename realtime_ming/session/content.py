"""Client content parts → engine `Content`: text as is, base64 audio → 16 kHz float32, image data
URLs → uint8 RGB arrays (Pillow). Failures raise `ProtocolError` with `invalid_audio` /
`invalid_image` and the param path of the offending part.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

from ..audio.pcm import AudioFormatError
from ..engine.api import Content
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.items import (
    ContentPart,
    InputAudio,
    InputImage,
    InputText,
    OutputAudio,
    OutputText,
)
from ..protocol.values import AudioFormat
from .audio_io import MODEL_SAMPLE_RATE_HZ, decode_audio_once

__all__ = ["decode_image_url", "part_to_content", "strip_audio"]

_MAX_IMAGE_PIXELS = 64_000_000  # Pillow raises above twice this (decompression-bomb guard)


def decode_image_url(url: str, param: str) -> np.ndarray:
    """`data:image/...;base64,...` → [H, W, 3] uint8 RGB; raises ProtocolError(invalid_image)."""
    from PIL import Image

    try:
        data = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        Image.MAX_IMAGE_PIXELS = _MAX_IMAGE_PIXELS
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (IndexError, binascii.Error, ValueError, OSError, Image.DecompressionBombError) as exc:
        raise ProtocolError(ErrorCode.INVALID_IMAGE, param=param, detail=str(exc) or type(exc).__name__) from exc


def part_to_content(part: ContentPart, input_format: AudioFormat, param: str) -> Content:
    """The model's view of one content part (audio in the session input format)."""
    if isinstance(part, InputText | OutputText):
        return Content.of_text(part.text)
    if isinstance(part, InputImage):
        return Content.of_image(decode_image_url(part.image_url, param))
    if isinstance(part, InputAudio) and part.audio is not None:
        try:
            audio = decode_audio_once(part.audio, input_format)
        except AudioFormatError as exc:
            raise ProtocolError(ErrorCode.INVALID_AUDIO, param=param, detail=str(exc)) from exc
        return Content.of_audio(audio, MODEL_SAMPLE_RATE_HZ)
    assert isinstance(part, InputAudio | OutputAudio)
    return Content.of_text(part.transcript or "")


def strip_audio(part: ContentPart) -> ContentPart:
    """The part as shown in `conversation.item.added/done` (audio bytes omitted, docs/protocol.md §5.1)."""
    if isinstance(part, InputAudio) and part.audio is not None:
        return InputAudio(transcript=part.transcript)
    return part
