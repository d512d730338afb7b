"""Thinker runner: KV slots per conversation, prefix reuse, chunked prefill, batched decode, sampling.

Each conversation owns a KV slot holding the token ids already computed; a new turn renders the
whole chat prompt, reuses the longest common prefix with the slot (backed off to a text token, so
no media block is split), encodes only the media in the new tail and prefills the tail in chunks
of `prefill_chunk_tokens` (the chunks of several queued prompts share one padded batch), one
chunk per step, interleaved with one decode step for every row that is generating (CUDA-graphed,
`ThinkerDecoder`). One device-to-host copy per step brings the sampled ids back.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..model.multimodal import AudioInput, ImageInput, MediaKind, VideoInput, prepare_prefill, rope_index_3d
from ..model.thinker import ThinkerKVCache
from ..model.tokenizer import ChatMessage
from .api import ContentKind, EngineBusyError, FinishReason, PromptTokens, TurnRequest, TurnTask
from .forced import Forced, forced_segments, forced_token, plan_forced
from .config import EngineConfig
from .graphs import upload
from .models import ModelBundle
from .prompt_budget import fit_prompt
from .sampling import SamplingBatch, sample
from .thinker_decode import ThinkerDecoder, default_kv_buckets, eager_kv_len
from .thinker_prefill import ThinkerPrefiller

__all__ = ["ThinkerRunner", "ThinkerOutput"]

log = logging.getLogger(__name__)

SLOW_ADMISSION_MS = 40.0  # admissions slower than this are logged with their parts
VISION_CACHE_BYTES = 256 * 2**20  # preprocessed images kept for turns that prefill them again


@dataclass(frozen=True, slots=True)
class ThinkerOutput:
    turn_id: str
    text: str = ""
    finish: FinishReason | None = None
    prefill_done: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    prompt: PromptTokens | None = None  # by modality, with prefill_done
    cached: PromptTokens | None = None


@dataclass
class _Slot:
    index: int
    conversation_id: str | None = None
    ids: list = field(default_factory=list)  # token ids whose K/V sit at cache positions 0..len-1
    busy: str | None = None  # turn id using the slot
    last_used: int = 0


@dataclass
class _Row:
    request: TurnRequest
    slot: _Slot
    prefill: object  # multimodal.PrefillInputs of the tail still to run
    tail_ids: list
    offset: int
    rope_delta: int
    prompt_tokens: int
    cached_tokens: int
    decoder: object
    generator: torch.Generator | None
    usage: tuple[PromptTokens, PromptTokens] | None = None  # (prompt, cached) by modality
    generated: list = field(default_factory=list)
    next_token: int | None = None
    text: str = ""
    emitted: int = 0  # characters of `text` already handed out (stop-string hold-back)
    forced: Forced | None = None  # tokens this row must emit (forced prefix / forced reply)


@dataclass(frozen=True, slots=True)
class _Launched:
    """A thinker step in flight: rows whose prefill completed, rows decoded, their sampled ids (host; ready
    once `ready` fires on CUDA), in that order."""

    prefilled: list
    decoded: list
    tokens: torch.Tensor | None
    ready: object  # torch.cuda.Event | None


def _to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    if rate == 16000:
        return np.asarray(audio, dtype=np.float32)
    from ..audio.resample import resample_torchaudio_compatible

    return resample_torchaudio_compatible(torch.from_numpy(np.asarray(audio, dtype=np.float32)), rate, 16000).numpy()


class ThinkerRunner:
    """Runs on the engine thread only."""

    def __init__(self, bundle: ModelBundle, cfg: EngineConfig):
        self.bundle = bundle
        self.cfg = cfg.thinker
        self.model = bundle.thinker
        self.tok = bundle.tokenizer
        self.device = torch.device(bundle.devices["thinker"])
        self.cache = ThinkerKVCache.allocate(bundle.cfg.thinker, self.cfg.max_slots, self.cfg.max_seq_len,
                                             device=self.device, dtype=bundle.dtype, tp=self.model.tp)
        self.slots = [_Slot(i) for i in range(self.cfg.max_slots)]
        self.rows: dict[str, _Row] = {}
        self._prefill_queue: deque[str] = deque()
        self._clock = 0
        # forced reply: `<|role_end|>`-separated segments (tool markers as their special tokens); a turn plays
        # the segment picked by how many assistant messages its history has, cycled when it has no end token
        self._forced = forced_segments(self.tok, self.cfg.forced_reply) if self.cfg.forced_reply else None
        # forced transcript (transcription side requests): said once, then the turn ends
        self._forced_transcript = (Forced(tuple(self.tok.encode(self.cfg.forced_transcript)) + (self.tok.eos_id,), False)
                                   if self.cfg.forced_transcript else None)
        self._markers = self.tok.marker_ids()  # with tools, tool-call markers reach the text stream verbatim
        self._vision = _VisionCache(VISION_CACHE_BYTES)
        buckets = (self.cfg.decode_buckets, self.cfg.kv_buckets or default_kv_buckets(self.cfg.max_seq_len))
        widths = tuple(w for w in self.cfg.prefill_buckets if w <= self.cfg.prefill_chunk_tokens)
        graphs = not cfg.enforce_eager and self.device.type == "cuda"
        # several prompts arriving together prefill as one graphed chunk: rows x width <= prefill_chunk_tokens
        shape = dict(rows=tuple(r for r in self.cfg.decode_buckets if r <= self.cfg.max_batch),
                     tokens=self.cfg.prefill_chunk_tokens)
        if hasattr(self.model, "decoder"):  # tensor-parallel proxy: a decoder (and prefiller) on every rank
            self.decoder = self.model.decoder(self.cache, *buckets, enforce_eager=cfg.enforce_eager)
            self.prefiller = self.model.prefiller(self.cache, widths, **shape) if graphs and widths else None
        else:
            self.decoder = ThinkerDecoder(self.model, self.cache, *buckets, device=self.device,
                                          enforce_eager=cfg.enforce_eager)
            self.prefiller = (ThinkerPrefiller(self.model, self.cache, widths, dtype=bundle.dtype, device=self.device,
                                               **shape) if graphs and widths else None)

    # ---- bookkeeping --------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.rows)

    def num_rows(self) -> int:
        return len(self.rows)

    def num_cached(self) -> int:
        return sum(1 for s in self.slots if s.conversation_id is not None)

    def close_conversation(self, conversation_id: str) -> None:
        for slot in self.slots:
            if slot.conversation_id == conversation_id and slot.busy is None:
                slot.conversation_id, slot.ids = None, []

    def cancel(self, turn_id: str) -> None:
        row = self.rows.pop(turn_id, None)
        if row is not None:
            row.slot.busy = None
            if turn_id in self._prefill_queue:
                self._prefill_queue.remove(turn_id)

    def _acquire_slot(self, conversation_id: str) -> _Slot:
        self._clock += 1
        own = [s for s in self.slots if s.conversation_id == conversation_id and s.busy is None]
        if own:
            slot = own[0]
        else:
            idle = [s for s in self.slots if s.busy is None]
            if not idle:
                raise EngineBusyError("engine busy: every thinker KV slot is in use")
            slot = min(idle, key=lambda s: (s.conversation_id is not None, s.last_used))  # free first, then LRU
            slot.ids = []
        slot.conversation_id = conversation_id
        slot.last_used = self._clock
        return slot

    # ---- admission: prompt, prefix reuse, media encoding ----------------------------------------
    def _chat(self, request: TurnRequest):
        """-> (system prompt, [(ChatMessage, its media payloads)]) of the request's conversation."""
        system_parts, messages = [], []
        if request.system is not None:
            system_parts.append(request.system)
        for msg in request.history:
            items, payloads = [], []
            for c in msg.content:
                if c.kind is ContentKind.TEXT:
                    items.append(c.text)
                elif c.kind is ContentKind.AUDIO:  # longer than the encoder's window: consecutive clips
                    for clip in self.bundle.audio_clips(_to_16k(c.audio, c.sample_rate_hz)):
                        items.append(AudioInput(self.bundle.audio_tokens(len(clip))))
                        payloads.append((MediaKind.AUDIO, clip))
                elif c.kind is ContentKind.IMAGE:  # the grid comes from the size; pixels only for the tail
                    items.append(ImageInput(self.bundle.image_grid(c.image)))
                    payloads.append((MediaKind.IMAGE, c.image))
                elif c.kind is ContentKind.VIDEO:
                    from ..model.image_processing import preprocess_video

                    vi, kept = preprocess_video(c.video, c.fps, self.bundle.cfg.preprocessor)
                    t, h, w = (int(v) for v in vi.grid_thw)
                    stamps = tuple(kept[2 * k] / c.fps for k in range(t))
                    items.append(VideoInput((h, w), stamps))
                    payloads.append((MediaKind.VIDEO_FRAME, vi))
            if msg.role == "system":
                system_parts.extend(i for i in items if isinstance(i, str))
            elif items or msg.tool_calls or msg.role == "tool":
                calls = tuple((c.name, c.arguments) for c in msg.tool_calls)
                messages.append((ChatMessage(msg.role, tuple(items), tool_calls=calls), payloads))
        system = "\n".join(system_parts) if system_parts else None
        return system, messages

    def _fitted_prompt(self, request: TurnRequest):
        """The chat prompt within the context budget (the request's truncation policy drops the oldest
        messages, never the system prompt) and the media payloads of the messages it kept."""
        system, messages = self._chat(request)
        fitted = fit_prompt(lambda first: self.tok.build_prompt([m for m, _ in messages[first:]], system=system,
                                                                tools=request.tools),
                            len(messages), self.tok.token_id("<role>"), max_seq_len=self.cfg.max_seq_len,
                            max_tokens=request.sampling.max_tokens, policy=request.truncation)
        if fitted.dropped:
            log.debug("turn %s: %d oldest messages truncated from the prompt", request.turn_id, fitted.dropped)
        return fitted.prompt, [p for _, payloads in messages[fitted.dropped:] for p in payloads]

    def admit(self, request: TurnRequest) -> None:
        """Tokenise, reuse the slot's cached prefix, encode new media; queue the tail's prefill."""
        marks = [time.perf_counter()]
        prompt, payloads = self._fitted_prompt(request)
        marks.append(time.perf_counter())
        ids = list(prompt.input_ids)
        slot = self._acquire_slot(request.conversation_id)
        p = 0
        for a, b in zip(slot.ids, ids):
            if a != b:
                break
            p += 1
        p = min(p, len(ids) - 1)  # at least one token to prefill: its logits start the reply
        for span in prompt.spans:  # never split a media block: restart at its start token
            if span.start - 1 <= p < span.start + span.length:
                p = min(p, span.start - 1)
        media = self.tok.media
        pos, _ = rope_index_3d(ids, media, prompt.image_grid_thw, prompt.video_grid_thw, start=0)
        tail = prompt.tail(p)
        embeds = self._encode_tail(prompt.spans, payloads, p)
        marks.append(time.perf_counter())
        prep = prepare_prefill(self.model.embed, tail, media, cache_start=p, rope_delta=int(pos[0, p]) - p,
                               device=self.device, **embeds)
        marks.append(time.perf_counter())
        parts = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
        if sum(parts) > SLOW_ADMISSION_MS:
            # the encoders run asynchronously: their GPU time (and any earlier queued GPU work) shows up in
            # "embed + splice", whose host-to-device copy waits for it
            log.info("admission of %s took %.0f ms: prompt + media preprocessing %.0f, encoders %.0f, embed + "
                     "splice %.0f (%d new tokens)", request.turn_id, sum(parts), *parts, len(ids) - p)
        slot.ids = ids[:p]
        slot.busy = request.turn_id
        gen = None
        if request.sampling.temperature > 0:
            seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
            gen = torch.Generator(device=self.device).manual_seed(seed)
        self.rows[request.turn_id] = _Row(request, slot, prep, list(tail.input_ids), 0, prep.rope_delta,
                                          len(ids), p, self.tok.incremental_decoder(), gen,
                                          (_by_modality(prompt.spans, len(ids)), _by_modality(prompt.spans, p)),
                                          forced=(self._forced_transcript if request.task is TurnTask.TRANSCRIBE
                                                  else plan_forced(self.tok, request, self._forced)))
        self._enqueue_prefill(request)

    def _enqueue_prefill(self, request: TurnRequest) -> None:
        """Replies prefill in arrival order; a transcription (a side request) waits behind every reply
        queued now, so it never delays a reply's first tokens by more than the decode row it adds."""
        queue = self._prefill_queue
        if request.task is TurnTask.TRANSCRIBE:
            queue.append(request.turn_id)
            return
        side = next((i for i, t in enumerate(queue) if self.rows[t].request.task is TurnTask.TRANSCRIBE
                     and self.rows[t].offset == 0), None)
        if side is None:
            queue.append(request.turn_id)
        else:
            queue.insert(side, request.turn_id)

    def _encode_tail(self, spans, payloads, start: int) -> dict:
        """Encoder outputs for the media whose placeholders lie in the tail (from token `start`)."""
        images, frames, audio = [], [], []
        for span, (kind, payload) in zip(spans, _expand(payloads, spans)):
            if span.start < start:
                continue
            if kind is MediaKind.AUDIO:
                audio.append(self.bundle.encode_audio(payload))
            elif kind is MediaKind.IMAGE:
                vi = self._vision.get(payload, self.bundle.vision_input)
                images.append(self.bundle.encode_image(vi.pixel_values, vi.grid_thw))
            else:
                frames.append(self.bundle.encode_image(*payload))
        out = {"audio_clips": audio}
        if images:
            out["image_embeds"] = torch.cat(images)
        if frames:
            out["video_embeds"] = torch.cat(frames)
        return out

    # ---- stepping ----------------------------------------------------------------------------
    def capture(self, progress=None) -> None:
        """Capture the decode and prefill CUDA graphs now (startup), not on the first user's turn."""
        self.decoder.capture(progress)
        if self.prefiller is not None:
            self.prefiller.capture(progress)
        self.bundle.audio_graphs.capture(progress)

    def step(self) -> list[ThinkerOutput]:
        """One batched prefill chunk (the oldest pending prompts) and one decode step for every generating row."""
        return self.collect(self.launch())

    def launch(self) -> "_Launched":
        """Queue this step's GPU work (prefill chunk, decode, sampling) and the copy of the sampled ids to
        the host, without waiting for any of it: the engine steps the talker meanwhile, then `collect`s."""
        decoding = [r for r in self.rows.values() if r.next_token is not None]
        done, sampled = [], []
        with torch.no_grad():
            if self._prefill_queue:
                done, tokens = self._prefill()
                if done:
                    sampled.append(tokens)
            if decoding:
                sampled.append(self._decode(decoding))
        if not sampled:
            return _Launched(done, [], None, None)
        ids = torch.cat(sampled) if len(sampled) > 1 else sampled[0]
        if ids.device.type != "cuda":
            return _Launched(done, decoding, ids, None)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)  # the step's one device-to-host copy
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(ids.device))
        return _Launched(done, decoding, host, ready)

    def collect(self, launched: "_Launched") -> list[ThinkerOutput]:
        """Wait for a launched step's sampled ids and account them (text, stops, finished rows)."""
        if launched.ready is not None:
            launched.ready.synchronize()
        tokens = launched.tokens.tolist() if launched.tokens is not None else []
        rows = launched.prefilled + launched.decoded  # the order of `tokens`
        outputs = []
        for i, (row, token) in enumerate(zip(rows, tokens)):
            if self.rows.get(row.request.turn_id) is not row:  # cancelled while the step was in flight
                continue
            if i < len(launched.prefilled):
                prompt, cached = row.usage or (None, None)
                outputs.append(ThinkerOutput(row.request.turn_id, prefill_done=True, prompt_tokens=row.prompt_tokens,
                                             cached_tokens=row.cached_tokens, prompt=prompt, cached=cached))
            outputs.append(self._accept(row, token))
        return outputs

    def _prefill_batch(self) -> list[tuple[_Row, int, int]]:
        """(row, start, end) chunks for this step: queue order, padded width x rows <= prefill_chunk_tokens, and
        never grown from a shape a prefill graph serves into one none does (14 rows of 35 tokens would pad to
        16 x 64, past the budget: eager, ~2,500 launches; 8 rows now and 6 next step are two graph replays)."""
        budget, width, chosen = self.cfg.prefill_chunk_tokens, 0, []
        fits = self.prefiller.fits if self.prefiller is not None else None
        for turn_id in self._prefill_queue:
            row = self.rows[turn_id]
            take = min(len(row.tail_ids) - row.offset, budget)
            wider, rows = max(width, take), len(chosen) + 1
            if chosen and (wider * rows > budget or rows > self.cfg.max_batch
                           or fits is not None and fits(width, rows - 1) and not fits(wider, rows)):
                break
            chosen.append((row, row.offset, row.offset + take))
            width = wider
        return chosen

    def _prefill(self) -> tuple[list[_Row], torch.Tensor | None]:
        """Run the chosen chunks as one padded batch (padding: cache position -1, written to the sink).
        -> the rows whose prompt is now complete and their sampled first ids (device)."""
        chosen = self._prefill_batch()
        width = max(end - start for _, start, end in chosen)
        b, dev = len(chosen), self.device
        first = chosen[0][0].prefill
        embeds = first.inputs_embeds.new_zeros(b, width, first.inputs_embeds.shape[-1])  # [B, W, D]
        rotary = torch.zeros(3, b, width, dtype=torch.int64, device=dev)  # [3, B, W]
        cache_pos = torch.full((b, width), -1, dtype=torch.int64, device=dev)  # [B, W]
        graphed = self.prefiller is not None and self.prefiller.fits(width, b)
        masks = {}
        for name in ("image_mask", "audio_mask"):  # the graphs always take both
            if graphed or any(getattr(r.prefill, name) is not None for r, _, _ in chosen):
                masks[name] = torch.zeros(b, width, dtype=torch.bool, device=dev)
        for i, (row, start, end) in enumerate(chosen):
            prep, n = row.prefill, end - start
            embeds[i, :n] = prep.inputs_embeds[0, start:end]
            rotary[:, i, :n] = prep.position_ids[:, 0, start:end]
            cache_pos[i, :n] = prep.cache_positions[0, start:end]
            for name, mask in masks.items():
                own = getattr(prep, name)
                if own is not None:
                    mask[i, :n] = own[0, start:end]
        slots = upload([r.slot.index for r, _, _ in chosen], torch.int64, dev)
        if graphed:
            hidden = self.prefiller.step(embeds, rotary, cache_pos, slots, masks["image_mask"], masks["audio_mask"])
        else:
            needed = max(len(r.slot.ids) + e - s for r, s, e in chosen)  # the slot holds its tokens before `s`
            hidden = self.model(embeds, rotary, cache=self.cache, slots=slots, cache_positions=cache_pos,
                                kv_len=eager_kv_len(needed, self.cfg.max_seq_len), **masks)
        done, last = [], []
        for i, (row, start, end) in enumerate(chosen):
            row.slot.ids.extend(row.tail_ids[start:end])
            row.offset = end
            if end == len(row.tail_ids):
                done.append(row)
                last.append(hidden[i, end - start - 1])
        if not done:
            return [], None
        for row in done:
            self._prefill_queue.remove(row.request.turn_id)
            row.prefill = None
        return done, sample(self.model.logits(torch.stack(last)), self._sampling(done))

    def _decode(self, rows: list[_Row]) -> torch.Tensor:
        """One decode step of `rows` -> their sampled ids (device)."""
        logits = self.decoder.step([r.next_token for r in rows], [len(r.slot.ids) for r in rows],
                                   [r.rope_delta for r in rows], [r.slot.index for r in rows])
        for r in rows:
            r.slot.ids.append(r.next_token)
        return sample(logits, self._sampling(rows))

    def _sampling(self, rows: list[_Row]) -> SamplingBatch:
        sp = [r.request.sampling for r in rows]
        return SamplingBatch([s.temperature for s in sp], [s.top_p for s in sp], [s.top_k for s in sp],
                             [r.generator for r in rows], self.device)

    def _accept(self, row: _Row, token: int) -> ThinkerOutput:
        """Account a sampled token: stream its text, apply eos / stop strings / length limits."""
        sp = row.request.sampling
        finish = None
        token = forced_token(row.forced, len(row.generated), token)
        if token == self.tok.eos_id and not sp.ignore_eos:
            finish = FinishReason.STOP
        else:
            row.generated.append(token)
            marker = self._markers.get(token) if row.request.tools else None  # else skipped like every special
            row.text += row.decoder.push(token) if marker is None else row.decoder.flush() + marker
            if len(row.generated) >= sp.max_tokens or len(row.slot.ids) + 1 >= self.cfg.max_seq_len:
                finish = FinishReason.LENGTH
        if finish is not None:
            row.text += row.decoder.flush()
        cut = _stop_cut(row.text, sp.stop)
        if cut is not None:
            row.text, finish = row.text[:cut], FinishReason.STOP
        safe = len(row.text) if finish is not None else len(row.text) - _stop_holdback(row.text, sp.stop)
        delta = row.text[row.emitted:safe]
        row.emitted = max(row.emitted, safe)
        if finish is None:
            row.next_token = token
            return ThinkerOutput(row.request.turn_id, text=delta)
        self.rows.pop(row.request.turn_id, None)
        row.slot.busy = None
        return ThinkerOutput(row.request.turn_id, text=delta, finish=finish, output_tokens=len(row.generated))


class _VisionCache:
    """Preprocessed images by the identity of their pixel array (a conversation keeps its arrays, and the
    entry holds the array, so an id is never reused while cached), least recently used out first, at most
    `max_bytes` of pixel rows. History images only need their grid (from the size); this spares the
    preprocessing when an image is prefilled again (a discarded speculative turn, an evicted KV slot)."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: dict[int, tuple[np.ndarray, object]] = {}
        self._max_bytes = max_bytes
        self._bytes = 0

    def get(self, image: np.ndarray, preprocess):
        hit = self._entries.pop(id(image), None)
        if hit is not None and hit[0] is image:
            self._entries[id(image)] = hit  # most recent last
            return hit[1]
        if hit is not None:
            self._bytes -= hit[1].pixel_values.nbytes
        vi = preprocess(image)
        size = vi.pixel_values.nbytes
        if size <= self._max_bytes:
            while self._entries and self._bytes + size > self._max_bytes:
                oldest = next(iter(self._entries))
                self._bytes -= self._entries.pop(oldest)[1].pixel_values.nbytes
            self._entries[id(image)] = (image, vi)
            self._bytes += size
        return vi


def _by_modality(spans, end: int) -> PromptTokens:
    """The first `end` prompt tokens by modality (a media block is never split by the cached prefix)."""
    audio = sum(s.length for s in spans if s.kind is MediaKind.AUDIO and s.start + s.length <= end)
    image = sum(s.length for s in spans if s.kind is not MediaKind.AUDIO and s.start + s.length <= end)
    return PromptTokens(end - audio - image, audio, image)


def _expand(payloads, spans):
    """Media payloads aligned with prompt spans: a video contributes one span per frame."""
    out = []
    it = iter(payloads)
    pending_video: list = []
    for span in spans:
        if span.kind is MediaKind.VIDEO_FRAME:
            if not pending_video:
                kind, vi = next(it)
                pending_video = _video_frames(vi)
            out.append((MediaKind.VIDEO_FRAME, pending_video.pop(0)))
        else:
            out.append(next(it))
    return out


def _video_frames(vi) -> list:
    t, h, w = (int(v) for v in vi.grid_thw)
    per = h * w
    return [(vi.pixel_values[k * per:(k + 1) * per], (1, h, w)) for k in range(t)]


def _stop_cut(text: str, stops) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _stop_holdback(text: str, stops) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best
