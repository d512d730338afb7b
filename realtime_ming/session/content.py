"""Client content parts → engine `Content`, validated and normalised so that a stored item can
always be prompted.

Text is kept as is (up to `MediaLimits.max_text_chars`); base64 audio becomes 16 kHz float32 of a
length the audio encoder accepts; an image data URL is checked from its header alone (pixel
budget, minimum side, aspect ratio: nothing is decoded for a rejected image), then decoded and
resized once to the size the vision preprocessing would resize it to (the engine's own
`smart_resize` target, so the pixels are the ones the model would see and the engine does no
second resize). Every rejection raises `ProtocolError` with a specific code and the param path.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

from ..audio.pcm import AudioFormatError, b64decode_audio
from ..audio.resample import resample
from ..engine.api import (
    Content,
    ContentKind,
    VideoSampling,
    resize_bicubic,
    smart_resize,
    video_frame_size,
    video_grid_indices,
)
from ..protocol import client_events as ce
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.items import (
    ContentPart,
    ImageDetail,
    InputAudio,
    InputImage,
    InputText,
    InputVideo,
    MessageItem,
    OutputAudio,
    OutputText,
    VideoFrame,
)
from ..protocol.values import AudioFormat
from ..protocol.wire import join
from .audio_io import MODEL_SAMPLE_RATE_HZ, wire_format
from .video_container import ContainerProbe

__all__ = [
    "MeasuredClip",
    "MediaLimits",
    "content_nbytes",
    "decode_audio",
    "decode_image_url",
    "decode_video_frames",
    "decode_video_url",
    "image_params",
    "measure_clip",
    "media_parts",
    "part_to_content",
    "stored_part",
    "video_parts",
]


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """What one stored item may hold.

    The first group is the model's own constraints, read from the engine's `info()["media"]`
    (`MediaLimits.from_engine`); the defaults are Ming's. The second group is the server's budgets
    (`server.limits`, `session.max_input_audio_s`, `session.min_commit_ms`), the image and video rates
    included (the session's token buckets, `media_rate.MediaRate`).
    """

    image_factor: int = 32  # ViT patch x spatial merge: resized sides are multiples; smaller sides rejected
    image_min_pixels: int = 4096  # the preprocessing's resize bounds (area)
    image_max_pixels: int = 16_777_216
    max_aspect_ratio: float = 200.0  # the preprocessing rejects more elongated images
    audio_min_samples: int = 201  # at 16 kHz: the mel frontend needs more than n_fft/2 samples
    max_image_pixels: int = 36_000_000  # source width x height, checked from the header before decoding
    max_text_chars: int = 256 * 1024  # per text part
    min_audio_ms: float = 100.0  # per audio part (also the manual-commit minimum)
    max_audio_s: float = 60.0  # per audio part
    max_video_s: float = 60.0  # per video part (first to last frame)
    max_conversation_bytes: int = 128 * 2**20  # what the conversation stores; oldest items evicted beyond
    max_images_per_s: float = 4.0  # `input_image` parts per second per session, sustained (token bucket refill)
    max_image_burst: int = 8  # ... and at once (the bucket's size; also the most images one event may carry)
    max_video_s_per_s: float = 1.0  # `input_video` seconds per second per session, sustained (burst: max_video_s)

    @classmethod
    def from_engine(cls, media: Mapping | None, **budgets) -> MediaLimits:
        """Model constraints from an engine's `info()["media"]` (unknown keys ignored) plus budgets."""
        names = {f.name for f in fields(cls)}
        model = {k: v for k, v in (media or {}).items() if k in names}
        return cls(**model, **budgets)

    @property
    def video_sampling(self):
        """The model's video frame sampling (`engine.api.VideoSampling`, Ming's V1 constants)."""
        return VideoSampling()

    @property
    def min_audio_samples(self) -> int:
        """Shortest audio part accepted, in 16 kHz samples."""
        return max(self.audio_min_samples, int(np.ceil(self.min_audio_ms * MODEL_SAMPLE_RATE_HZ / 1000)))


def _image_error(code: ErrorCode, param: str, **values) -> ProtocolError:
    return ProtocolError(code, param=param, **values)


# `detail: "low"`: the image is scaled to at most this many pixels before the model sees it (OpenAI's
# low-res mode is 512 x 512); "high" and "auto" keep the model's own preprocessing budget.
LOW_DETAIL_MAX_PIXELS = 512 * 512


def _b64_payload(url: str, param: str, code: ErrorCode) -> bytes:
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (IndexError, binascii.Error, ValueError) as exc:
        raise ProtocolError(code, param=param, detail=str(exc) or type(exc).__name__) from exc


@contextlib.contextmanager
def _opened_image(url: str, param: str, limits: MediaLimits):
    """The image of a data URL, opened lazily (only its header read) and checked against the pixel
    budget, the minimum side and the aspect ratio; decoding errors become ProtocolError."""
    from PIL import Image

    # The pixel budget below is checked from the header first; Pillow's own warning would only add noise.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    data = _b64_payload(url, param, ErrorCode.INVALID_IMAGE)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            dims = {"width": width, "height": height}
            if width * height > limits.max_image_pixels:
                raise _image_error(ErrorCode.IMAGE_TOO_LARGE, param, max_pixels=limits.max_image_pixels, **dims)
            if min(width, height) < limits.image_factor:
                raise _image_error(ErrorCode.IMAGE_TOO_SMALL, param, min_side=limits.image_factor, **dims)
            if max(width, height) / min(width, height) > limits.max_aspect_ratio:
                raise _image_error(ErrorCode.IMAGE_ASPECT_RATIO_TOO_LARGE, param,
                                   max_ratio=f"{limits.max_aspect_ratio:g}", **dims)
            yield image
    except ProtocolError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own guard, above ~179 M pixels
        raise _image_error(ErrorCode.IMAGE_TOO_LARGE, param, width="?", height="?",
                           max_pixels=limits.max_image_pixels) from exc
    except (ValueError, OSError, SyntaxError, Image.UnidentifiedImageError) as exc:
        raise ProtocolError(ErrorCode.INVALID_IMAGE, param=param, detail=str(exc) or type(exc).__name__) from exc


def _rgb(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def decode_image_url(url: str, param: str, limits: MediaLimits = MediaLimits(),
                     detail: ImageDetail | None = None) -> np.ndarray:
    """`data:image/...;base64,...` → [H, W, 3] uint8 RGB at the model's preprocessing size.

    The header is read first (Pillow opens lazily): an image over the pixel budget, with a side
    below `image_factor` or an aspect ratio above the model's maximum is rejected before any
    pixel is decoded. Raises ProtocolError (invalid_image, image_too_large, image_too_small,
    image_aspect_ratio_too_large).
    """
    with _opened_image(url, param, limits) as image:
        width, height = image.size
        max_pixels = limits.image_max_pixels
        if detail is ImageDetail.LOW:
            max_pixels = max(min(max_pixels, LOW_DETAIL_MAX_PIXELS), limits.image_min_pixels)
        target_h, target_w = smart_resize(height, width, limits.image_factor, limits.image_min_pixels, max_pixels)
        if min(target_h, target_w) < limits.image_factor:  # squeezed to nothing by the area bound
            raise _image_error(ErrorCode.IMAGE_ASPECT_RATIO_TOO_LARGE, param,
                               max_ratio=f"{limits.max_aspect_ratio:g}", width=width, height=height)
        rgb = _rgb(image)
    return resize_bicubic(rgb, target_h, target_w)


def _check_span(stamps: list[float], param: str, limits: MediaLimits) -> None:
    if stamps[-1] - stamps[0] > limits.max_video_s:
        raise ProtocolError(ErrorCode.VIDEO_TOO_LONG, param=param, duration_s=stamps[-1] - stamps[0],
                            max_s=limits.max_video_s)


def _clip_indices(stamps: list[float], param: str, limits: MediaLimits) -> list[int]:
    _check_span(stamps, param, limits)
    try:
        return video_grid_indices(stamps, limits.video_sampling)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INVALID_VIDEO, param=param, detail=str(exc)) from exc


def _clip_size(height: int, width: int, count: int, limits: MediaLimits) -> tuple[int, int]:
    return video_frame_size(height, width, count, limits.video_sampling, limits.image_factor)


def _video(indices: list[int], picked: Mapping[int, np.ndarray], limits: MediaLimits) -> Content:
    return Content(ContentKind.VIDEO, video=np.stack([picked[i] for i in indices]), fps=limits.video_sampling.fps)


def decode_video_frames(frames: tuple[VideoFrame, ...], param: str, limits: MediaLimits = MediaLimits()) -> Content:
    """`input_video` frames → VIDEO content: the frames shown at the model's sampling rate
    (`video_grid_indices`), each resized to the per-frame budget size, with `fps` = that rate.

    Every frame's header is checked (`invalid_image` & co. name the frame); only the sampled
    frames are decoded, one at a time. Frames of another size than the clip's most common one are
    resized to it first (as the reference does). Raises ProtocolError (also `video_too_long`).
    """
    indices = _clip_indices([f.timestamp_s for f in frames], join(param, "frames"), limits)
    sizes = []
    for i, frame in enumerate(frames):
        with _opened_image(frame.image_url, f"{param}.frames[{i}].image_url", limits) as image:
            sizes.append(image.size)
    width, height = Counter(sizes[i] for i in indices).most_common(1)[0][0]
    target_h, target_w = _clip_size(height, width, len(indices), limits)
    picked: dict[int, np.ndarray] = {}
    for i in dict.fromkeys(indices):
        with _opened_image(frames[i].image_url, f"{param}.frames[{i}].image_url", limits) as image:
            rgb = _rgb(image)
        if rgb.shape[:2] != (height, width):
            rgb = resize_bicubic(rgb, height, width)
        picked[i] = resize_bicubic(rgb, target_h, target_w)
    return _video(indices, picked, limits)


@dataclass(frozen=True, slots=True)
class MeasuredClip:
    """An `input_video` part's span (first to last frame) and frame count, learned without decoding a pixel:
    what the session's video rate takes and the stored part echoes. A `video_url` clip keeps its bytes and
    container probe, so that its decode does not read the container's headers again."""

    span_s: float
    num_frames: int
    container: tuple[bytes, ContainerProbe] | None = None


def _probe_url(url: str, param: str, limits: MediaLimits) -> tuple[bytes, ContainerProbe]:
    """The bytes of a `data:video` URL and their container probe (demuxed, nothing decoded), with the
    frame size checked as an image's would be."""
    from .video_container import probe

    data = _b64_payload(url, param, ErrorCode.INVALID_VIDEO)
    probed = probe(data, param, max_pixels=limits.max_image_pixels, max_s=limits.max_video_s)
    if min(probed.width, probed.height) < limits.image_factor:
        raise _image_error(ErrorCode.IMAGE_TOO_SMALL, param, min_side=limits.image_factor,
                           width=probed.width, height=probed.height)
    if max(probed.width, probed.height) / min(probed.width, probed.height) > limits.max_aspect_ratio:
        raise _image_error(ErrorCode.IMAGE_ASPECT_RATIO_TOO_LARGE, param, max_ratio=f"{limits.max_aspect_ratio:g}",
                           width=probed.width, height=probed.height)
    return data, probed


def measure_clip(part: InputVideo, param: str, limits: MediaLimits = MediaLimits()) -> MeasuredClip:
    """The span of a clip with its payload (`param` names the part): from the frames' timestamps, or from
    the container's packets (`video_container.probe`). Raises ProtocolError (`video_too_long`,
    `invalid_video`, `video_decoder_unavailable`, `image_too_large`/`_too_small`/`_aspect_ratio_too_large`)."""
    if part.video_url is None:
        stamps = [f.timestamp_s for f in part.frames]
        _check_span(stamps, join(param, "frames"), limits)
        return MeasuredClip(stamps[-1] - stamps[0], len(stamps))
    data, probed = _probe_url(part.video_url, join(param, "video_url"), limits)
    stamps = probed.timestamps_s
    return MeasuredClip(stamps[-1] - stamps[0], len(stamps), (data, probed))


def decode_video_url(url: str, param: str, limits: MediaLimits = MediaLimits(),
                     measured: MeasuredClip | None = None) -> Content:
    """`data:video/...;base64,...` → VIDEO content, sampled and resized as `decode_video_frames`
    (needs PyAV, the `video` extra; else `video_decoder_unavailable`). A `measured` clip
    (`measure_clip`) is not probed again."""
    from .video_container import decode_frames

    if measured is not None and measured.container is not None:
        data, probed = measured.container
    else:
        data, probed = _probe_url(url, param, limits)
    indices = _clip_indices(list(probed.timestamps_s), param, limits)
    target_h, target_w = _clip_size(probed.height, probed.width, len(indices), limits)
    picked: dict[int, np.ndarray] = {}

    def keep(i: int, rgb: np.ndarray) -> None:
        picked[i] = resize_bicubic(np.ascontiguousarray(rgb), target_h, target_w)

    decode_frames(data, param, probed, set(indices), keep)
    return _video(indices, picked, limits)


def decode_audio(b64: str, fmt: AudioFormat, param: str, limits: MediaLimits = MediaLimits()) -> np.ndarray:
    """Base64 audio in `fmt` → float32 [n] at 16 kHz within the per-part length limits.

    The duration is checked from the byte count before anything is decoded. Raises ProtocolError
    (invalid_audio, input_audio_too_short, input_audio_too_long).
    """
    codec = wire_format(fmt)
    try:
        data = b64decode_audio(b64)
        duration_ms = codec.duration_ms(len(data))
    except AudioFormatError as exc:
        raise ProtocolError(ErrorCode.INVALID_AUDIO, param=param, detail=str(exc)) from exc
    if duration_ms > limits.max_audio_s * 1000:
        raise ProtocolError(ErrorCode.INPUT_AUDIO_TOO_LONG, param=param, duration_s=duration_ms / 1000,
                            max_s=limits.max_audio_s)
    audio = resample(codec.decode(data), codec.sample_rate_hz, MODEL_SAMPLE_RATE_HZ)
    if audio.size < limits.min_audio_samples:
        raise ProtocolError(ErrorCode.INPUT_AUDIO_TOO_SHORT, param=param, duration_ms=duration_ms,
                            min_ms=1000 * limits.min_audio_samples / MODEL_SAMPLE_RATE_HZ)
    return audio


def _text(text: str, param: str, limits: MediaLimits) -> Content:
    if len(text) > limits.max_text_chars:
        raise ProtocolError(ErrorCode.INPUT_TEXT_TOO_LONG, param=param, num_chars=len(text),
                            max_chars=limits.max_text_chars)
    return Content.of_text(text)


def part_to_content(part: ContentPart, input_format: AudioFormat, param: str,
                    limits: MediaLimits = MediaLimits(), measured: MeasuredClip | None = None) -> Content:
    """The model's view of one content part (audio in the session input format; a video clip's
    `measure_clip` result reused when given); raises ProtocolError."""
    if isinstance(part, InputText | OutputText):
        return _text(part.text, param, limits)
    if isinstance(part, InputImage):
        return Content.of_image(decode_image_url(part.image_url, param, limits, part.detail))
    if isinstance(part, InputVideo):
        if part.video_url is not None:
            return decode_video_url(part.video_url, join(param, "video_url"), limits, measured)
        return decode_video_frames(part.frames, param, limits)
    if isinstance(part, InputAudio) and part.audio is not None:
        return Content.of_audio(decode_audio(part.audio, input_format, param, limits), MODEL_SAMPLE_RATE_HZ)
    assert isinstance(part, InputAudio | OutputAudio)
    return _text(part.transcript or "", param, limits)


def content_nbytes(content: Content) -> int:
    """Bytes one model-view content holds (its array; a text counts its characters)."""
    if content.kind is ContentKind.TEXT:
        return len(content.text or "")
    array = {ContentKind.AUDIO: content.audio, ContentKind.IMAGE: content.image}.get(content.kind, content.video)
    return 0 if array is None else int(array.nbytes)


def stored_part(part: ContentPart, clip: MeasuredClip | None = None) -> ContentPart:
    """The part as stored and shown in `conversation.item.*` events: audio bytes omitted
    (docs/protocol.md §5.1), a video replaced by the summary of the clip the client sent (`clip`, its
    `measure_clip`: frames given or in the container, first to last timestamp), not of the frames the model
    samples from it."""
    if isinstance(part, InputAudio) and part.audio is not None:
        return InputAudio(transcript=part.transcript)
    if isinstance(part, InputVideo) and clip is not None:
        return InputVideo(num_frames=clip.num_frames, duration_s=round(clip.span_s, 3))
    return part


def _message_parts(event: object) -> list[tuple[str, ContentPart]]:
    """(param, part) of every content part of the inline message items `event` carries."""
    if isinstance(event, ce.ConversationItemCreate):
        items = [("item", event.item)]
    elif isinstance(event, ce.ResponseCreate) and event.response.input is not None:
        items = [(f"response.input[{i}]", item) for i, item in enumerate(event.response.input)]
    else:
        return []
    return [
        (f"{param}.content[{i}]", part)
        for param, item in items if isinstance(item, MessageItem)
        for i, part in enumerate(item.content)
    ]


def media_parts(event: object) -> list[tuple[str, ContentPart]]:
    """(param, part) of every content part of `event` that carries media to decode."""
    return [
        (param, part) for param, part in _message_parts(event)
        if isinstance(part, InputImage | InputVideo) or (isinstance(part, InputAudio) and part.audio is not None)
    ]


def image_params(event: object) -> list[str]:
    """The param path of every `input_image` part of `event`: what the session's image rate counts."""
    return [param for param, part in _message_parts(event) if isinstance(part, InputImage)]


def video_parts(event: object) -> list[tuple[str, InputVideo]]:
    """(param, part) of every `input_video` clip of `event`: what the session's video rate counts."""
    return [(param, part) for param, part in _message_parts(event) if isinstance(part, InputVideo) and part.has_payload]
