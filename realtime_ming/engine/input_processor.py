"""The input processor: a turn's prompt and media, prepared off the engine thread.

`Engine.submit` hands each request to a small worker pool at once; by the time the engine thread
admits the turn (`ThinkerRunner.admit`) the chat template is rendered within the context budget
(`prompt_budget.fit_prompt`), tokenised, its 3-D rope positions computed, its audio resampled to
16 kHz and cut into encoder clips, its videos sampled and preprocessed, and the pixel rows of every
image the turn may prefill preprocessed. The engine thread then only matches the cached prefix and
runs the encoders on the tail.

Media are cached by content (a digest of the array's bytes, shape and dtype; the digest of an array
object already seen is remembered while the array lives), least recently used out first within
`EngineConfig.media_cache_mb`: an image of the history is preprocessed once, not on every turn.
Images the conversation's KV slot already holds (`KVSlotManager.peek`, a hint) only need their grid;
if the slot was evicted before admission, the missing pixels are preprocessed then (`vision`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from ..model.multimodal import AudioInput, ImageInput, MediaKind, MultimodalPrompt, VideoInput, rope_index_3d
from ..model.tokenizer import ChatMessage
from .api import ContentKind, TurnRequest, TurnTask
from .kv_slots import KVSlotManager
from .prompt_budget import fit_prompt
from .prompt_meter import PromptMeter

__all__ = ["ImagePayload", "InputProcessor", "MediaCache", "PreparedInputs", "expand_payloads"]

log = logging.getLogger(__name__)

_MAX_REMEMBERED_CONVERSATIONS = 4096  # where each conversation's last prompt began (`_first_kept`), newest kept
_WINDOW = 4  # messages that tell where a prompt began (`_window`)


@dataclass(frozen=True, slots=True)
class ImagePayload:
    image: np.ndarray  # uint8 HWC RGB
    key: bytes  # content digest
    vision: object | None  # VisionInput, None where the slot is expected to hold the image already


@dataclass(frozen=True, slots=True)
class PreparedInputs:
    """A request's fitted prompt, its 3-D rope positions and the media payloads of the kept messages, in prompt
    order: (AUDIO, 16 kHz clip), (IMAGE, ImagePayload), (VIDEO_FRAME, VisionInput of the whole video)."""

    prompt: MultimodalPrompt
    positions: torch.Tensor  # [3, T] rope positions of `prompt`
    payloads: tuple


def _to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    if rate == 16000:
        return np.asarray(audio, dtype=np.float32)
    from ..audio.resample import resample_torchaudio_compatible

    return resample_torchaudio_compatible(torch.from_numpy(np.asarray(audio, dtype=np.float32)), rate, 16000).numpy()


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    pixels = getattr(value, "pixel_values", None)
    return int(pixels.nbytes) if pixels is not None else 0


class MediaCache:
    """Preprocessed media by content, least recently used out first, at most `max_bytes`. Thread-safe; two
    threads missing the same key at once both compute it (the second result replaces the first)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._digests: dict[int, tuple[weakref.ref, bytes]] = {}  # id(array) -> (array, digest) while it lives
        self.hits = self.misses = 0

    def digest(self, array: np.ndarray) -> bytes:
        """A content key of `array` (bytes, shape, dtype); an array object seen before is not hashed again."""
        known = self._digests.get(id(array))
        if known is not None and known[0]() is array:
            return known[1]
        data = np.ascontiguousarray(array)
        h = hashlib.blake2b(f"{data.dtype.str}{data.shape}".encode(), digest_size=16)
        h.update(memoryview(data).cast("B"))
        key = h.digest()
        try:
            ident = id(array)
            ref = weakref.ref(array, lambda _r, ident=ident: self._digests.pop(ident, None))
            self._digests[ident] = (ref, key)
        except TypeError:  # an object without weak references: hashed each time
            pass
        return key

    def get(self, key: tuple, compute: Callable[[], object]):
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit[0]
            self.misses += 1
        value = compute()
        size = _nbytes(value)
        if size <= self._max_bytes:
            with self._lock:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]
                while self._entries and self._bytes + size > self._max_bytes:
                    self._bytes -= self._entries.popitem(last=False)[1][1]
                self._entries[key] = (value, size)
                self._bytes += size
        return value


class InputProcessor:
    """Prepares requests on `workers` threads (`submit`) or inline (`prepare`). `bundle` gives the tokenizer,
    the preprocessor settings and the audio clip rules; `slots` (optional) the KV-slot hint;
    `auto_truncation_ratio` the retention ratio `truncation: auto` cuts to (`prompt_budget`); `meter` the cache of
    system turns (instructions + tools) encoded once and reused by every turn that has them."""

    def __init__(self, bundle, *, max_seq_len: int, workers: int = 2, cache_bytes: int = 512 * 2**20,
                 slots: KVSlotManager | None = None, auto_truncation_ratio: float = 1.0,
                 meter: PromptMeter | None = None):
        self.bundle = bundle
        self.tok = bundle.tokenizer
        self.max_seq_len = max_seq_len
        self.meter = meter or PromptMeter(self.tok, None, max_seq_len=max_seq_len, caption_budget=0)
        self._firsts: OrderedDict[str, int] = OrderedDict()  # conversation -> key of its last prompt's 1st message
        self._first_lock = threading.Lock()
        self.auto_truncation_ratio = auto_truncation_ratio
        self.slots = slots
        self.cache = MediaCache(cache_bytes)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="realtime-ming-inputs")

    def submit(self, request: TurnRequest) -> Future:
        """Start preparing `request` on a worker thread -> a Future of its PreparedInputs (or its error)."""
        return self._pool.submit(self.prepare, request)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- preparation ---------------------------------------------------------------------------
    def prepare(self, request: TurnRequest) -> PreparedInputs:
        """Render, fit and tokenise the chat prompt; preprocess the media the turn may prefill."""
        system, messages, keys = self._chat(request)
        policy = request.truncation
        if policy.mode == "auto":  # the server's choice: one cut that the next turns' cached prefix survives
            policy = replace(policy, retention_ratio=self.auto_truncation_ratio)
        system_ids = self.meter.system_ids(system, request.tools)  # bounded; over the context: refused here
        fitted = fit_prompt(lambda first: self.tok.build_prompt([m for m, _ in messages[first:]],
                                                                system_ids=system_ids),
                            [m.role for m, _ in messages], self.tok.token_id("<role>"), max_seq_len=self.max_seq_len,
                            max_tokens=request.sampling.max_tokens, policy=policy,
                            sticky=self._first_kept(request.conversation_id, keys))
        if request.task is TurnTask.REPLY and fitted.dropped < len(keys):
            self._remember_first(request.conversation_id, _window(keys, fitted.dropped))
        if fitted.dropped:
            log.debug("turn %s: %d oldest messages truncated from the prompt", request.turn_id, fitted.dropped)
        prompt = fitted.prompt
        payloads = [p for _, payloads in messages[fitted.dropped:] for p in payloads]
        held = self.slots.peek(request.conversation_id) if self.slots is not None else ()
        start = KVSlotManager.match_prefix(held, list(prompt.input_ids), prompt.spans) if held else 0
        payloads = self._with_pixels(prompt.spans, payloads, start)
        pos, _ = rope_index_3d(list(prompt.input_ids), self.tok.media, prompt.image_grid_thw, prompt.video_grid_thw,
                               start=0)
        return PreparedInputs(prompt, pos, tuple(payloads))

    def _first_kept(self, conversation_id: str, keys: list) -> int | None:
        """Index of the message the conversation's last prompt began with, if it is still in `keys`."""
        with self._first_lock:
            key = self._firsts.get(conversation_id)
        if key is None:
            return None
        return next((i for i in range(len(keys)) if _window(keys, i) == key), None)

    def _remember_first(self, conversation_id: str, key) -> None:
        with self._first_lock:
            self._firsts[conversation_id] = key
            self._firsts.move_to_end(conversation_id)
            while len(self._firsts) > _MAX_REMEMBERED_CONVERSATIONS:
                self._firsts.popitem(last=False)

    def vision(self, payload: ImagePayload):
        """The preprocessed image (from the cache, else computed now)."""
        if payload.vision is not None:
            return payload.vision
        return self.cache.get(("image", payload.key), lambda: self.bundle.vision_input(payload.image))

    def _with_pixels(self, spans, payloads: list, start: int) -> list:
        """Payloads with pixel rows for every image whose placeholders are not all within the first `start`
        prompt tokens (the prefix the conversation's slot holds)."""
        out, at = [], 0
        for kind, payload in payloads:
            span = spans[at]
            if kind is MediaKind.VIDEO_FRAME:
                at += int(payload.grid_thw[0])
            else:
                at += 1
            if kind is MediaKind.IMAGE and span.start + span.length > start:
                payload = ImagePayload(payload.image, payload.key, self.vision(payload))
            out.append((kind, payload))
        return out

    def _chat(self, request: TurnRequest):
        """-> (system prompt, [(ChatMessage, its media payloads)], [a content key of each message]) of the
        request's conversation (the key tells a message again in a later turn's history: `_first_kept`)."""
        system_parts, messages, keys = [], [], []
        if request.system is not None:
            system_parts.append(request.system)
        for msg in request.history:
            items, payloads, media = [], [], []
            for c in msg.content:
                if c.kind is not ContentKind.TEXT:
                    media.append(self.cache.digest(next(a for a in (c.audio, c.image, c.video) if a is not None)))
                if c.kind is ContentKind.TEXT:
                    items.append(c.text)
                elif c.kind is ContentKind.AUDIO:  # longer than the encoder's window: consecutive clips
                    for clip in self._clips(c.audio, c.sample_rate_hz):
                        items.append(AudioInput(self.bundle.audio_tokens(len(clip))))
                        payloads.append((MediaKind.AUDIO, clip))
                elif c.kind is ContentKind.IMAGE:  # the grid comes from the size; pixels only where needed
                    items.append(ImageInput(self.bundle.image_grid(c.image)))
                    payloads.append((MediaKind.IMAGE, ImagePayload(c.image, self.cache.digest(c.image), None)))
                elif c.kind is ContentKind.VIDEO:
                    vi, kept = self._video(c.video, c.fps)
                    t, h, w = (int(v) for v in vi.grid_thw)
                    stamps = tuple(kept[2 * k] / c.fps for k in range(t))
                    items.append(VideoInput((h, w), stamps))
                    payloads.append((MediaKind.VIDEO_FRAME, vi))
            if msg.role == "system":
                system_parts.extend(i for i in items if isinstance(i, str))
            elif items or msg.tool_calls or msg.role == "tool":
                calls = tuple((c.name, c.arguments) for c in msg.tool_calls)
                messages.append((ChatMessage(msg.role, tuple(items), tool_calls=calls), payloads))
                keys.append(hash((msg.role, tuple(i for i in items if isinstance(i, str)), calls, tuple(media))))
        system = "\n".join(system_parts) if system_parts else None
        return system, messages, keys

    def _clips(self, audio: np.ndarray, rate: int) -> list:
        key = ("audio", self.cache.digest(audio), int(rate))
        return self.cache.get(key, lambda: self.bundle.audio_clips(_to_16k(audio, rate)))

    def _video(self, video: np.ndarray, fps: float):
        from ..model.image_processing import preprocess_video

        key = ("video", self.cache.digest(video), float(fps))
        return self.cache.get(key, lambda: preprocess_video(video, fps, self.bundle.cfg.preprocessor))


def _window(keys: list[int], i: int) -> int:
    """Message `i` told by its own key and the next few (replies such as "OK" repeat; a run of messages rarely)."""
    return hash(tuple(keys[i:i + _WINDOW]))


def expand_payloads(payloads, spans) -> list:
    """Media payloads aligned with prompt spans: a video contributes one span per frame."""
    out = []
    it = iter(payloads)
    pending_video: list = []
    for span in spans:
        if span.kind is MediaKind.VIDEO_FRAME:
            if not pending_video:
                _, vi = next(it)
                pending_video = _video_frames(vi)
            out.append((MediaKind.VIDEO_FRAME, pending_video.pop(0)))
        else:
            out.append(next(it))
    return out


def _video_frames(vi) -> list:
    t, h, w = (int(v) for v in vi.grid_thw)
    per = h * w
    return [(vi.pixel_values[k * per:(k + 1) * per], (1, h, w)) for k in range(t)]
