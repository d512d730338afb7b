"""Thinker runner: runs the thinker for the rows the scheduler picks -- chunked prefill, batched decode, sampling.

The parts around it: `input_processor` prepares each request off the engine thread (chat template,
tokens, media preprocessing); `kv_slots` owns the KV slots (one per conversation, prefix reuse, LRU,
forks); `scheduler` picks each step's prefill chunks and decode batch; `output_processor` turns sampled
tokens into text and finishes. Admission (`admit`) matches the slot's cached prefix, encodes only the
media in the new tail and queues the tail's prefill, which runs in chunks of `prefill_chunk_tokens` (the
chunks of several queued prompts share one padded batch), one chunk per step, interleaved with one
decode step for every row that is generating (CUDA-graphed, `ThinkerDecoder`). One device-to-host copy
per step brings the sampled ids back.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch

from ..model.multimodal import MediaKind, prepare_prefill
from ..model.thinker import ThinkerKVCache
from .api import FinishReason, PromptTokens, TurnRequest, TurnTask
from .config import EngineConfig
from .forced import Forced, forced_segments, plan_forced
from .graphs import upload
from .input_processor import InputProcessor, PreparedInputs, expand_payloads
from .kv_slots import KVSlotManager, copy_kv_prefix
from .models import ModelBundle
from .output_processor import OutputProcessor
from .sampling import SamplingBatch, sample
from .scheduler import Row, Scheduler
from .thinker_decode import ThinkerDecoder, default_kv_buckets, eager_kv_len
from .thinker_prefill import ThinkerPrefiller

__all__ = ["ThinkerRunner", "ThinkerOutput"]

log = logging.getLogger(__name__)

SLOW_ADMISSION_MS = 40.0  # admissions slower than this are logged with their parts


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


@dataclass(frozen=True, slots=True)
class _Launched:
    """A thinker step in flight: rows whose prefill completed, rows decoded, their sampled ids (host; ready
    once `ready` fires on CUDA), in that order."""

    prefilled: list
    decoded: list
    tokens: torch.Tensor | None
    ready: object  # torch.cuda.Event | None


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
        self.slots = KVSlotManager(self.cfg.max_slots, self._copy_kv)
        self.scheduler = Scheduler(self.cfg.max_batch, self.cfg.prefill_chunk_tokens)
        self.inputs = InputProcessor(bundle, max_seq_len=self.cfg.max_seq_len, workers=cfg.input_workers,
                                     cache_bytes=cfg.media_cache_mb * 2**20, slots=self.slots)
        self.outputs = OutputProcessor(self.tok, self.cfg.max_seq_len)
        # forced reply: `<|role_end|>`-separated segments (tool markers as their special tokens); a turn plays
        # the segment picked by how many assistant messages its history has, cycled when it has no end token
        self._forced = forced_segments(self.tok, self.cfg.forced_reply) if self.cfg.forced_reply else None
        # forced transcript (transcription side requests): said once, then the turn ends
        self._forced_transcript = (Forced(tuple(self.tok.encode(self.cfg.forced_transcript)) + (self.tok.eos_id,), False)
                                   if self.cfg.forced_transcript else None)
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
        return self.scheduler.has_work()

    def num_rows(self) -> int:
        return len(self.scheduler.rows)

    def num_cached(self) -> int:
        return self.slots.num_cached()

    def close_conversation(self, conversation_id: str) -> None:
        self.slots.close_conversation(conversation_id)

    def cancel(self, turn_id: str) -> None:
        self.scheduler.remove(turn_id)

    def close(self) -> None:
        self.inputs.close()

    def _copy_kv(self, src: int, dst: int, length: int) -> None:
        copy = getattr(self.model, "copy_kv", None)  # tensor-parallel proxy: every rank copies its shard
        if copy is not None:
            copy(self.cache, src, dst, length)
        else:
            copy_kv_prefix(self.cache, src, dst, length)

    # ---- admission: prefix reuse, media encoding ------------------------------------------------
    def admit(self, request: TurnRequest, prepared: PreparedInputs | None = None) -> None:
        """Reuse the slot's cached prefix, encode the tail's media; queue the tail's prefill. `prepared` comes
        from the input processor (the engine prepares every request off this thread); None prepares it here."""
        marks = [time.perf_counter()]
        if prepared is None:
            prepared = self.inputs.prepare(request)
        prompt = prepared.prompt
        marks.append(time.perf_counter())
        ids = list(prompt.input_ids)
        if request.prefix_from is not None:  # a side request: starts from the source's prefix (K/V copied)
            slot, p = self.slots.fork(request.prefix_from, request.conversation_id, ids, prompt.spans)
        else:
            slot = self.slots.acquire(request.conversation_id)
            p = self.slots.match_prefix(slot.ids, ids, prompt.spans)
        tail = prompt.tail(p)
        embeds = self._encode_tail(prompt.spans, prepared.payloads, p)
        marks.append(time.perf_counter())
        prep = prepare_prefill(self.model.embed, tail, self.tok.media, cache_start=p,
                               rope_delta=int(prepared.positions[0, p]) - p, device=self.device, **embeds)
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
        self.scheduler.add(Row(request, slot, prep, list(tail.input_ids), 0, prep.rope_delta, len(ids), p,
                               self.tok.incremental_decoder(), gen,
                               (_by_modality(prompt.spans, len(ids)), _by_modality(prompt.spans, p)),
                               forced=(self._forced_transcript if request.task is TurnTask.TRANSCRIBE
                                       else plan_forced(self.tok, request, self._forced))))

    def fork_ready(self, request: TurnRequest) -> bool:
        """Whether `request` may be admitted now: a side request waits while its source conversation's turn is
        still prefilling (its fork would copy less of the shared prompt), never holding that turn up."""
        return request.prefix_from is None or not self.scheduler.prefilling(request.prefix_from)

    def _encode_tail(self, spans, payloads, start: int) -> dict:
        """Encoder outputs for the media whose placeholders lie in the tail (from token `start`)."""
        images, frames, audio = [], [], []
        for span, (kind, payload) in zip(spans, expand_payloads(payloads, spans)):
            if span.start < start:
                continue
            if kind is MediaKind.AUDIO:
                audio.append(self.bundle.encode_audio(payload))
            elif kind is MediaKind.IMAGE:
                vi = self.inputs.vision(payload)  # prepared already, unless the slot lost the image meanwhile
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
        decoding = self.scheduler.decoding()
        done, sampled = [], []
        with torch.no_grad():
            if self.scheduler.prefill_queue:
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
            if not self.scheduler.is_live(row):  # cancelled while the step was in flight
                continue
            if i < len(launched.prefilled):
                prompt, cached = row.usage or (None, None)
                outputs.append(ThinkerOutput(row.request.turn_id, prefill_done=True, prompt_tokens=row.prompt_tokens,
                                             cached_tokens=row.cached_tokens, prompt=prompt, cached=cached))
            outputs.append(self._accept(row, token))
        return outputs

    def _prefill(self) -> tuple[list[Row], torch.Tensor | None]:
        """Run the scheduler's chunks as one padded batch (padding: cache position -1, written to the sink).
        -> the rows whose prompt is now complete and their sampled first ids (device)."""
        chosen = self.scheduler.prefill_batch(self.prefiller.fits if self.prefiller is not None else None)
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
        done = self.scheduler.prefilled(chosen)
        if not done:
            return [], None
        complete = {id(row) for row in done}
        last = [hidden[i, end - start - 1] for i, (row, start, end) in enumerate(chosen) if id(row) in complete]
        return done, sample(self.model.logits(torch.stack(last)), self._sampling(done))

    def _decode(self, rows: list[Row]) -> torch.Tensor:
        """One decode step of `rows` -> their sampled ids (device)."""
        logits = self.decoder.step([r.next_token for r in rows], [len(r.slot.ids) for r in rows],
                                   [r.rope_delta for r in rows], [r.slot.index for r in rows])
        for r in rows:
            r.slot.ids.append(r.next_token)
        return sample(logits, self._sampling(rows))

    def _sampling(self, rows: list[Row]) -> SamplingBatch:
        sp = [r.request.sampling for r in rows]
        return SamplingBatch([s.temperature for s in sp], [s.top_p for s in sp], [s.top_k for s in sp],
                             [r.generator for r in rows], self.device)

    def _accept(self, row: Row, token: int) -> ThinkerOutput:
        """Account a sampled token: stream its text, apply eos / stop strings / length limits."""
        delta, finish = self.outputs.accept(row, token)
        if finish is None:
            return ThinkerOutput(row.request.turn_id, text=delta)
        self.scheduler.remove(row.request.turn_id)
        return ThinkerOutput(row.request.turn_id, text=delta, finish=finish, output_tokens=len(row.generated))


def _by_modality(spans, end: int) -> PromptTokens:
    """The first `end` prompt tokens by modality (a media block is never split by the cached prefix)."""
    audio = sum(s.length for s in spans if s.kind is MediaKind.AUDIO and s.start + s.length <= end)
    image = sum(s.length for s in spans if s.kind is not MediaKind.AUDIO and s.start + s.length <= end)
    return PromptTokens(end - audio - image, audio, image)
