"""Thinker runner: runs the thinker for the rows the scheduler picks -- chunked prefill, batched decode, sampling.

The parts around it: `input_processor` prepares each request off the engine thread (chat template,
tokens, media preprocessing); `kv_slots` owns the KV slots (one per conversation, prefix reuse, LRU,
forks); `scheduler` picks each step's prefill chunks and decode batch; `output_processor` turns sampled
tokens into text and finishes. Admission (`admit`) matches the slot's cached prefix, encodes only the
media in the new tail and queues the tail's prefill, which runs in chunks of `prefill_chunk_tokens` (the
chunks of several queued prompts share one padded batch), one chunk per step, interleaved with one
decode step for every row that is generating (CUDA-graphed, `ThinkerDecoder`) -- or, with
`mixed_step_tokens`, both in one forward (`ThinkerMixer`: the experts read once). One device-to-host copy per step
brings the sampled ids back.
"""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from ..model.multimodal import MediaKind, prepare_prefill
from ..model.thinker import ThinkerKVCache
from .api import FinishReason, PromptTokens, TurnRequest, TurnTask
from .config import EngineConfig
from .forced import Forced, allowed_tokens, forced_segments, plan_forced
from .graphs import upload
from .encoder_worker import EncoderWorker, encode_tail, tail_has_media
from .input_processor import InputProcessor, PreparedInputs
from .kv_slots import KVSlotManager, copy_kv_prefix
from .models import ModelBundle
from .output_processor import OutputProcessor
from .prefill_pace import PrefillPace
from .prompt_meter import PromptMeter
from .sampling import SamplingBatch, mask_to_allowed, sample
from .scheduler import Row, Scheduler
from .turn_judgement import answer_ids, turn_judgement_on
from .thinker_decode import ThinkerDecoder, default_kv_buckets, eager_kv_len
from .thinker_mixed import ThinkerMixer, mixed_buckets, pack_mixed
from .thinker_prefill import ThinkerPrefiller

__all__ = ["ThinkerRunner", "ThinkerOutput"]

log = logging.getLogger(__name__)

# CUDA-graph widths of a one-row prefill chunk (those up to prefill_chunk_tokens are captured)
PREFILL_WIDTHS = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
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
    p_complete: float | None = None  # a JUDGE_TURN turn's answer (with its finish)


@dataclass(frozen=True, slots=True)
class _Launched:
    """A thinker step in flight: rows whose prefill completed, rows decoded, their sampled ids (host; ready
    once `ready` fires on CUDA), in that order."""

    prefilled: list
    decoded: list
    tokens: torch.Tensor | None
    ready: object  # torch.cuda.Event | None
    chunk: bool = False  # a prefill chunk was queued in this step (it reads every MoE expert: a longer step)

    @property
    def idle(self) -> bool:
        """Nothing to collect: no prefill completed, no row decoded."""
        return not self.prefilled and not self.decoded and self.tokens is None


@dataclass(slots=True)
class _Pending:
    """An admission waiting for its tail's encoders (on the encoder worker); its slot is reserved."""

    request: TurnRequest
    prepared: PreparedInputs
    slot: object  # KVSlot
    start: int  # the cached prefix it keeps
    t0: float  # perf_counter at admission
    encoded: Future | None = None


class ThinkerRunner:
    """Runs on the engine thread only."""

    def __init__(self, bundle: ModelBundle, cfg: EngineConfig, wake: Callable[[], None] | None = None):
        """`wake` is called from the encoder worker when an admission's encoders finished (`admitted`)."""
        self.bundle = bundle
        self.cfg = cfg.thinker
        self.model = bundle.thinker
        self.tok = bundle.tokenizer
        self.device = torch.device(bundle.devices["thinker"])
        self.cache = ThinkerKVCache.allocate(bundle.cfg.thinker, self.cfg.max_slots, self.cfg.max_seq_len,
                                             device=self.device, dtype=bundle.dtype, tp=self.model.tp)
        self.slots = KVSlotManager(self.cfg.max_slots, self._copy_kv)
        self.scheduler = Scheduler(self.cfg.max_batch, self.cfg.prefill_chunk_tokens)
        self.pace = PrefillPace(self.cfg.prefill_step_ms, self.cfg.prefill_chunk_tokens)
        talker_tok = getattr(bundle, "talker_tokenizer", None)
        self.meter = PromptMeter(self.tok, None if talker_tok is None else
                                 (lambda text: talker_tok.encode(text, add_special_tokens=False).ids),
                                 max_seq_len=self.cfg.max_seq_len, caption_budget=cfg.talker.caption_budget)
        self.inputs = InputProcessor(bundle, max_seq_len=self.cfg.max_seq_len, workers=cfg.input_workers,
                                     cache_bytes=cfg.media_cache_mb * 2**20, slots=self.slots,
                                     auto_truncation_ratio=self.cfg.auto_truncation_ratio, meter=self.meter)
        self.outputs = OutputProcessor(self.tok, self.cfg.max_seq_len)
        self._encoder = (EncoderWorker(bundle, self.inputs.vision, out_device=self.device, on_done=wake)
                         if cfg.encoder_worker else None)
        self._pending: dict[str, _Pending] = {}  # turn id -> admission whose encoders run, in admission order
        # forced reply: `<|role_end|>`-separated segments (tool markers as their special tokens); a turn plays
        # the segment picked by how many assistant messages its history has, cycled when it has no end token
        hooks = bundle.hooks
        self._forced = forced_segments(self.tok, hooks.forced_reply) if hooks.forced_reply else None
        # forced transcript (transcription side requests): said once, then the turn ends
        self._forced_transcript = (Forced(tuple(self.tok.encode(hooks.forced_transcript)) + (self.tok.eos_id,), False)
                                   if hooks.forced_transcript else None)
        self._forced_judgement = hooks.forced_turn_judgement
        # turn judgements (JUDGE_TURN): the answers' token ids, from this checkpoint's tokenizer; None = off
        self.judge_answers = answer_ids(self.tok) if turn_judgement_on(cfg) else None
        buckets = (self.cfg.decode_buckets, default_kv_buckets(self.cfg.max_seq_len))  # 512, 1024, ... max_seq_len
        widths = tuple(w for w in PREFILL_WIDTHS if w <= self.cfg.prefill_chunk_tokens)
        graphs = not cfg.enforce_eager and self.device.type == "cuda"
        # several prompts arriving together prefill as one graphed chunk: rows x width <= prefill_chunk_tokens
        shape = dict(rows=tuple(r for r in self.cfg.decode_buckets if r <= self.cfg.max_batch),
                     tokens=self.cfg.prefill_chunk_tokens)
        if hasattr(self.model, "decoder"):  # tensor-parallel proxy: a decoder (and prefiller) on every rank
            self.decoder = self.model.decoder(self.cache, *buckets, enforce_eager=cfg.enforce_eager)
            self.prefiller = self.model.prefiller(self.cache, widths, **shape) if graphs and widths else None
            make_mixer = self.model.mixer
        else:
            self.decoder = ThinkerDecoder(self.model, self.cache, *buckets, device=self.device,
                                          enforce_eager=cfg.enforce_eager)
            self.prefiller = (ThinkerPrefiller(self.model, self.cache, widths, dtype=bundle.dtype, device=self.device,
                                               **shape) if graphs and widths else None)
            make_mixer = partial(ThinkerMixer, self.model, dtype=bundle.dtype, device=self.device)
        # the mixed step (decode rows + a chunk in one forward): room for every decode row a step may carry and
        # the first tokens of as many prompts
        self.mixer = (make_mixer(self.cache, mixed_buckets(self.cfg.mixed_step_tokens), picks=2 * self.cfg.max_batch,
                                 enforce_eager=cfg.enforce_eager) if self.cfg.mixed_step_tokens else None)

    # ---- bookkeeping --------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def num_rows(self) -> int:
        return len(self.scheduler.rows)

    def num_cached(self) -> int:
        return self.slots.num_cached()

    def close_conversation(self, conversation_id: str) -> None:
        self.slots.close_conversation(conversation_id)

    def pause(self, turn_id: str) -> None:
        """Take a row out of the decode batch (slot, position, next token and sampler kept) until `resume`."""
        self.scheduler.pause(turn_id)

    def resume(self, turn_id: str) -> None:
        self.scheduler.resume(turn_id)

    def generated(self, turn_id: str) -> int:
        """Tokens a live row has sampled so far (0 for a turn not admitted or gone)."""
        row = self.scheduler.rows.get(turn_id)
        return 0 if row is None else len(row.generated)

    def cancel(self, turn_id: str) -> None:
        self.scheduler.remove(turn_id)
        pending = self._pending.pop(turn_id, None)
        if pending is not None:  # its encoders' result is dropped (a queued job does not run)
            pending.encoded.cancel()
            pending.slot.busy = None

    def close(self) -> None:
        self.inputs.close()
        if self._encoder is not None:
            self._encoder.close()

    def _copy_kv(self, src: int, dst: int, length: int) -> None:
        copy = getattr(self.model, "copy_kv", None)  # tensor-parallel proxy: every rank copies its shard
        if copy is not None:
            copy(self.cache, src, dst, length)
        else:
            copy_kv_prefix(self.cache, src, dst, length)

    # ---- admission: prefix reuse, media encoding ------------------------------------------------
    def admit(self, request: TurnRequest, prepared: PreparedInputs | None = None) -> bool:
        """Reuse the slot's cached prefix and queue the tail's prefill. `prepared` comes from the input
        processor (the engine prepares every request off this thread); None prepares it here. A tail with media
        is encoded on the encoder worker meanwhile (the slot is the turn's from now on): -> False, and the
        admission completes in a later `launch` (`admitted` reports it). A tail without media: -> True, queued."""
        t0 = time.perf_counter()
        if prepared is None:
            prepared = self.inputs.prepare(request)
        ids = list(prepared.prompt.input_ids)
        if request.prefix_from is not None:  # a side request: starts from the source's prefix (K/V copied)
            slot, p = self.slots.fork(request.prefix_from, request.conversation_id, ids, prepared.prompt.spans)
        else:
            slot = self.slots.acquire(request.conversation_id)
            p = self.slots.match_prefix(slot.ids, ids, prepared.prompt.spans)
        slot.ids = ids[:p]
        slot.busy = request.turn_id
        pending = _Pending(request, prepared, slot, p, t0)
        if self._encoder is not None and tail_has_media(prepared.prompt.spans, p):
            pending.encoded = self._encoder.submit(prepared.prompt.spans, prepared.payloads, p)
            self._pending[request.turn_id] = pending
            return False
        try:
            self._queue(pending, self._encode(pending))
        except BaseException:
            slot.busy = None
            raise
        return True

    def admitted(self) -> list[tuple[str, BaseException | None]]:
        """Complete the admissions whose encoders finished (their prefill is queued): -> (turn id, None) for
        each, (turn id, the error) for each that failed (its slot is free again)."""
        done = []
        for turn_id, pending in list(self._pending.items()):
            if not pending.encoded.done():
                continue
            del self._pending[turn_id]
            try:
                self._queue(pending, pending.encoded.result().take(self.device))
            except Exception as exc:  # the encoders', or the splice's: this turn fails alone
                pending.slot.busy = None
                done.append((turn_id, exc))
            else:
                done.append((turn_id, None))
        return done

    def encoding(self) -> int:
        """Admissions whose encoders are still running."""
        return len(self._pending)

    def _encode(self, pending: "_Pending") -> dict:
        """The tail's encoder outputs, on this thread (no encoder worker, or no media in the tail)."""
        with torch.no_grad():
            return encode_tail(self.bundle, self.inputs.vision, pending.prepared.prompt.spans,
                               pending.prepared.payloads, pending.start)

    def _queue(self, pending: "_Pending", embeds: dict) -> None:
        """Embed the tail, splice its encoder outputs (no host sync), queue its prefill."""
        request, prepared, slot, p = pending.request, pending.prepared, pending.slot, pending.start
        prompt = prepared.prompt
        ids = list(prompt.input_ids)
        tail = prompt.tail(p)
        t1 = time.perf_counter()
        with torch.no_grad():
            prep = prepare_prefill(self.model.embed, tail, self.tok.media, cache_start=p,
                                   rope_delta=int(prepared.positions[0, p]) - p, device=self.device, **embeds)
        t2 = time.perf_counter()
        total = (t2 - pending.t0) * 1e3
        if total > SLOW_ADMISSION_MS:
            # with media in the tail, "encoders" is the wall time on the encoder worker (the engine thread
            # stepped meanwhile); "embed + splice" is engine-thread time, queued without a host sync
            log.info("admission of %s took %.0f ms: encoders %.0f, embed + splice %.0f (%d new tokens)",
                     request.turn_id, total, (t1 - pending.t0) * 1e3, (t2 - t1) * 1e3, len(ids) - p)
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
        still being encoded or prefilled (its fork would copy less of the shared prompt), never holding it up."""
        source = request.prefix_from
        return source is None or not (self.scheduler.prefilling(source) or any(
            pending.request.conversation_id == source for pending in self._pending.values()))

    # ---- stepping ----------------------------------------------------------------------------
    def capture(self, progress=None) -> None:
        """Capture the decode and prefill CUDA graphs now (startup), not on the first user's turn."""
        self.decoder.capture(progress)
        if self.prefiller is not None:
            self.prefiller.capture(progress)
        if self.mixer is not None:
            self.mixer.capture(progress)
        self.bundle.audio_graphs.capture(progress)

    def step(self) -> list[ThinkerOutput]:
        """One batched prefill chunk (the oldest pending prompts) and one decode step for every generating row
        (admissions whose encoders finished join it; a failed one raises)."""
        for _, error in self.admitted():
            if error is not None:
                raise error
        return self.collect(self.launch())

    def launch(self) -> "_Launched":
        """Queue this step's GPU work (prefill chunk, decode, sampling) and the copy of the sampled ids to
        the host, without waiting for any of it: the engine steps the talker meanwhile, then `collect`s."""
        decoding = self.scheduler.decoding()
        done, sampled = [], []
        # beside decoding rows a long prompt part-way is held while the host time since its last chunk is below
        # that chunk's (`PrefillPace.holds`): the rows decode alone meanwhile; a new prompt still prefills
        fresh_only = bool(decoding) and self.pace.holds()
        chunk = self.scheduler.waiting(fresh_only)
        with torch.no_grad():
            if chunk and decoding and self.mixer is not None and len(decoding) < min(self.mixer.picks,
                                                                                     self.mixer.max_tokens):
                done, ids = self._mixed(decoding, fresh_only)
                return self._ship(done, decoding, ids, True)
            if chunk:
                done, tokens = self._prefill(fresh_only)
                if done:
                    sampled.append(tokens)
            if decoding:
                sampled.append(self._decode(decoding))
        if not sampled:
            return _Launched(done, [], None, None, chunk)  # a prompt's chunk may have run, none complete
        return self._ship(done, decoding, torch.cat(sampled) if len(sampled) > 1 else sampled[0], chunk)

    def _ship(self, done: list[Row], decoding: list[Row], ids: torch.Tensor, chunk: bool) -> "_Launched":
        """Queue the copy of a step's sampled ids (prefilled rows', then decoded rows') to the host."""
        if ids.device.type != "cuda":
            return _Launched(done, decoding, ids, None, chunk)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)  # the step's one device-to-host copy
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(ids.device))
        return _Launched(done, decoding, host, ready, chunk)

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

    def _prefill(self, fresh_only: bool = False) -> tuple[list[Row], torch.Tensor | None]:
        """Run the scheduler's chunks as one padded batch (padding: cache position -1, written to the sink), cut
        to the pace's budget (`fresh_only`: of prompts not started yet). -> the rows whose prompt is now complete
        and their sampled first ids (device)."""
        chosen = self.scheduler.prefill_batch(self.prefiller.fits if self.prefiller is not None else None,
                                              self.pace.budget(), fresh_only)
        if not chosen:  # a scheduler may hold the queue back this step
            return [], None
        started = self.pace.clock()
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
        self.pace.observe(width * b, self.pace.clock() - started)  # host time: the launches on a GPU
        done = self.scheduler.prefilled(chosen)
        if not done:
            return [], None
        complete = {id(row) for row in done}
        last = [hidden[i, end - start - 1] for i, (row, start, end) in enumerate(chosen) if id(row) in complete]
        logits = self.model.logits(torch.stack(last))
        self._judge(logits, done)
        return done, self._sample(logits, done)

    def _judge(self, logits: torch.Tensor, done: list[Row]) -> None:
        """A turn judgement's P(complete) from its prefill's logits (row i of `logits` is `done[i]`'s): the
        softmax over the two answers' logits (device scalar; read when its step is collected)."""
        for i, row in enumerate(done):
            if row.request.task is TurnTask.JUDGE_TURN:
                pair = logits[i, list(self.judge_answers)].float()
                row.judgement = torch.softmax(pair, dim=-1)[0]

    def _mixed(self, decoding: list[Row], fresh_only: bool = False) -> tuple[list[Row], torch.Tensor]:
        """One forward for the decode rows and a chunk packed into the tokens they leave (`thinker_mixed`) ->
        the rows whose prompt completed, and the sampled ids of those rows then of `decoding` (device)."""
        mixer = self.mixer
        chosen = self.scheduler.prefill_packed(mixer.max_tokens - len(decoding), mixer.picks - len(decoding),
                                               fresh_only)
        needed, ints, embeds, last = pack_mixed(decoding, chosen, device=self.device, dtype=self.bundle.dtype,
                                                hidden=self.model.cfg.hidden_size)
        done = self.scheduler.prefilled(chosen)
        for r in decoding:
            r.slot.ids.append(r.next_token)
        complete = {id(row) for row in done}
        pick = [at for (row, _, _), at in zip(chosen, last) if id(row) in complete] + list(range(len(decoding)))
        logits = mixer.step(needed, ints, embeds, upload(pick, torch.int64, self.device))
        self._judge(logits, done)
        return done, self._sample(logits, done + decoding)

    def _decode(self, rows: list[Row]) -> torch.Tensor:
        """One decode step of `rows` -> their sampled ids (device)."""
        logits = self.decoder.step([r.next_token for r in rows], [len(r.slot.ids) for r in rows],
                                   [r.rope_delta for r in rows], [r.slot.index for r in rows])
        for r in rows:
            r.slot.ids.append(r.next_token)
        return self._sample(logits, rows)

    def _sample(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """Sampled ids of `rows`; a row within a forced choice samples only among the tokens it allows."""
        allowed = [allowed_tokens(r.forced, r.generated) for r in rows]
        return sample(mask_to_allowed(logits, allowed), self._sampling(rows))

    def _sampling(self, rows: list[Row]) -> SamplingBatch:
        sp = [r.request.sampling for r in rows]
        return SamplingBatch([s.temperature for s in sp], [s.top_p for s in sp], [s.top_k for s in sp],
                             [r.generator for r in rows], self.device)

    def _accept(self, row: Row, token: int) -> ThinkerOutput:
        """Account a sampled token: stream its text, apply eos / stop strings / length limits. A turn judgement
        ends at its prefill with its answer (its sampled token is not used)."""
        if row.request.task is TurnTask.JUDGE_TURN:
            self.scheduler.remove(row.request.turn_id)
            forced = self._forced_judgement
            p = float(row.judgement) if forced is None else forced
            return ThinkerOutput(row.request.turn_id, finish=FinishReason.STOP, p_complete=p)
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
