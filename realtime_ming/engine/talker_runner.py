"""Talker runner: every active talker stream of one replica advances together, one AR step per launch.

A text segment from the segmenter is cut by the reference text front-end into fragments; each fragment is one talker
stream (fresh LM cache and latent history, the voice prompt re-used, docs/model.md §5.9/§5.11), and a turn's
fragments run one after another so its audio stays in order, while streams of different turns share every batched
step: talker-LM decode, CFM + CFG + aggregator + stop head (`Talker.tail_step`) and the history update as one step
(`talker_step`, one CUDA graph per batch bucket when graphs are on), then the streaming AudioVAE chunk (`VAEStepper`,
graphed too) and the silence holder. Active streams occupy rows 0..n-1 of the static state; a finished stream's row
is refilled from the last row (compaction), so each step runs exactly n rows. A turn's first job (a "lead") runs a
second talker step over rows 0..leads-1 in the launch that starts it: the streaming VAE emits each chunk only once
the next one is decoded, so the turn's first audio leaves in that launch instead of the next; its audio is unchanged
(its own noise generator, batch-invariant rows). Later jobs, which the listener is not waiting for, run one step per
launch -- or several, queued back to back (`launch(steps)`: a talker process's loop, `engine.talker.steps_per_launch`);
a stream that ends at one of them keeps nothing of the later ones, so the audio is the same whatever the steps per
launch. A talker process's loop may keep a launch (`launch(keep=True)`) and queue the next before finishing it
(pipelined, `engine/talker_loop.py`): each stream counts its queued steps, and `finish` matches a launch's rows to
streams by identity, since rows move between (jobs started by the later launch, streams ended by the earlier
finish); the VAE's work and state live on a CUDA stream of their own, so finishing one launch does not wait for the
next (`engine/talker_sync.py`).

A turn's talker work can be paused (`pause`, an unconfirmed speculative turn that holds enough audio,
`engine/speculation.py`): its running stream leaves the rows with a copy of its row state (LM cache, history, VAE
state) and keeps its own noise generator, its queued jobs wait; on `resume` the stream is put back at the next
step's admission, before any new job, and goes on exactly as if it had never stopped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..model.cfm import CFMParams, sway_time_grid
from ..model.talker import build_talker_prompt, duration_step_cap, initial_history, should_stop
from ..model.number_zh import talker_tn
from ..model.talker_text import talker_job_texts
from ..model.vae_stream import SilenceHolder
from .config import EngineConfig
from .graphs import upload
from .models import ModelBundle
from .talker_replica import TalkerReplica, first_replica
from .talker_rows import RowState, TalkerRows
from .talker_step import PROMPT_BUCKETS, Progress, TalkerPrefiller, TalkerStepper, VoiceHeadCache, prefill_buckets
from .talker_sync import QueuedStep, TalkerStreams
from .vae_step import VAEStepper
from .voice_store import CustomVoice

__all__ = ["TalkerRunner", "TalkerOutput", "stream_seed"]

_SECONDS_PER_STEP = 0.32  # 4 latents × 4 frames × 882 samples at 44.1 kHz


@dataclass(frozen=True, slots=True)
class TalkerOutput:
    turn_id: str
    segment_id: int
    pcm: np.ndarray | None  # float32 44.1 kHz, may be empty
    first_step: bool = False
    error: str | None = None  # this turn's talker work failed (other turns unaffected)
    steps: int = 1  # talker steps behind `pcm` (a first job's catch-up, or several steps queued in one launch)


@dataclass(frozen=True, slots=True)
class _Launched:
    """Talker steps in flight: outputs of jobs started (or failed) this step, and each queued step (`QueuedStep`:
    latents, stop probabilities, the streams it stepped by row) in order — empty when no stream runs (a later step
    may cover only the leads' rows)."""

    started: list
    steps: list


@dataclass
class _Job:
    turn_id: str
    segment_id: int
    text: str
    voice: str | CustomVoice
    seed: int
    caption: str | None = None  # the talker's style caption (speech rate, emotion, …), as the turn asked
    first: bool = False  # the turn's first job: the listener is waiting for its first chunk


def stream_seed(turn_seed: int, job_index: int) -> int:
    """Noise seed of a turn's `job_index`-th talker job: its audio does not depend on other streams."""
    return (turn_seed * 1_000_003 + job_index) % (2**63)


@dataclass
class _Stream:
    job: _Job
    pos: int  # next talker-LM position
    max_steps: int
    step: int = 0
    fresh: bool = True  # prefilled this step: its h is ready, no LM decode needed
    queued: int = 0  # talker steps queued on the GPU and not yet collected
    # a turn's first job runs two talker steps in the engine step that starts it: the streaming VAE holds every
    # chunk until the next one arrives (one-chunk lookahead), so its first audio leaves one engine step earlier
    lead: bool = False
    silence: SilenceHolder | None = None
    generator: torch.Generator | None = None


class TalkerRunner:
    """Runs on one thread (the engine's, or a talker process's loop). `replica`: which of the bundle's talker
    replicas it steps (default the first, i.e. `bundle.talker` / `bundle.vae`); `engine.talker.max_streams` rows of
    its own."""

    def __init__(self, bundle: ModelBundle, cfg: EngineConfig, replica: TalkerReplica | None = None):
        replica = replica or first_replica(bundle)
        self.bundle = bundle
        self.replica = replica
        self.cfg = cfg.talker
        self.steps_per_word = bundle.hooks.steps_per_word  # > 0: a fixed talker length (benchmarks)
        # a turn's first job runs two talker steps in the step that starts it (the VAE holds each chunk until the
        # next one): the same audio, its first chunk one step sooner, for one small extra talker + VAE pass
        self.catch_up = True
        self.talker = replica.talker
        self.vae = replica.vae
        tcfg = bundle.cfg.talker
        self.device = replica.device
        self.vae_device = replica.vae_device
        self.dtype = bundle.dtype
        self.patch = tcfg.patch_size
        self.steps = tcfg.steps
        # the talker's and the VAE's work goes to CUDA streams of their own, so it runs beside the thinker's and
        # a step's VAE chunk beside the next talker step (`engine/talker_sync.py`)
        self._gpu = TalkerStreams(self.device, self.vae_device)
        self.rows = TalkerRows(self.talker, self.vae, tcfg, self.cfg.max_streams, self.cfg.max_prompt_len, self._gpu,
                               device=self.device, vae_device=self.vae_device, dtype=self.dtype)
        self.cache, self.his, self.h = self.rows.cache, self.rows.his, self.rows.h
        self.next_embed, self.vae_state = self.rows.next_embed, self.rows.vae_state
        self.t_grid = sway_time_grid(self.steps, self.dtype, self.device)
        self.sde_args = CFMParams().tensor(self.device, self.dtype)  # the reference's CFG strength, sigma, temperature
        self.stepper = TalkerStepper(self.talker, self.cache, self.t_grid, self.sde_args, self.cfg.buckets,
                                     dtype=self.dtype, device=self.device, enforce_eager=cfg.enforce_eager)
        self.vae_step = VAEStepper(self.vae, self.vae_state, self.cfg.buckets, device=self.vae_device,
                                   enforce_eager=cfg.enforce_eager)
        # every prompt `_start` prefills fits a graph: a job's prompt is cut to `prompt_limit` tokens
        self.prompt_limit = self.cfg.max_prompt_len // 2
        self.prefiller = TalkerPrefiller(self.talker, self.cfg.max_prompt_len,
                                         prefill_buckets(PROMPT_BUCKETS, self.cfg.max_prompt_len,
                                                         self.prompt_limit),
                                         dtype=self.dtype, device=self.device, enforce_eager=cfg.enforce_eager)
        self.heads = VoiceHeadCache(self.cfg.voice_head_cache)  # each voice's prompt head, prefilled once
        self.seed = cfg.seed
        cuda = {d for d in (self.device, self.vae_device) if d.type == "cuda"}
        for prompt, _ in bundle.voices.values():  # the presets on this replica's device now, not at a first job
            replica.voices(prompt)
        for d in cuda:  # the state above was written on this thread's stream
            torch.cuda.synchronize(d)
        self.streams: list[_Stream] = []
        self.queues: dict[str, deque[_Job]] = {}
        self._job_count: dict[str, int] = {}  # jobs queued so far per turn (noise seeds)
        self._paused: set[str] = set()  # turns whose talker work waits for `resume`
        self._parked: dict[str, tuple[_Stream, RowState]] = {}  # paused turn -> its stream, row state
        # running totals (`TalkerLoop.stats`): host seconds starting jobs, jobs started, steps queued, rows stepped
        self.counts = {"admit_s": 0.0, "jobs": 0, "steps": 0, "rows": 0}
        tok = bundle.talker_tokenizer
        self._encode = lambda text: tok.encode(text, add_special_tokens=False).ids

    # ---- bookkeeping --------------------------------------------------------------------------
    def enqueue(self, turn_id: str, segment_id: int, text: str, voice: str | CustomVoice | None, *,
                seed: int | None = None, caption: str | None = None) -> None:
        """Queue a segment: the reference front-end cuts it into talker jobs (may be none), each text
        normalised as the reference's TalkerTN does (`model/number_zh.py`); a job left with nothing to
        say is dropped. `caption` goes into every job's prompt (`build_talker_prompt(caption=…)`).

        `seed` (default: the engine seed) and the job's index within the turn fix its noise.
        """
        voice = voice or self.bundle.default_voice
        jobs = self.queues.setdefault(turn_id, deque())
        counter = self._job_count.get(turn_id, 0)
        for piece in talker_job_texts(text, tn=talker_tn):
            if not piece.strip():
                continue
            seed_ = stream_seed(self.seed if seed is None else seed, counter)
            jobs.append(_Job(turn_id, segment_id, piece, voice, seed_, caption, first=counter == 0))
            counter += 1
        self._job_count[turn_id] = counter

    @property
    def cuda_stream(self) -> torch.cuda.Stream | None:
        """The CUDA stream this runner's talker steps run on (None off CUDA): time them there."""
        return self._gpu.talker_stream

    def has_work(self) -> bool:
        """Whether a step has anything to run (a paused turn's work waits)."""
        return (bool(self.streams) or any(jobs for t, jobs in self.queues.items() if t not in self._paused)
                or any(t not in self._paused for t in self._parked))

    def pending(self, turn_id: str) -> bool:
        return bool(self.queues.get(turn_id)) or turn_id in self._parked or self.running(turn_id)

    def running(self, turn_id: str) -> bool:
        """Whether a stream of the turn is in the rows (stepped, maybe queued on the GPU)."""
        return any(s.job.turn_id == turn_id for s in self.streams)

    def num_streams(self) -> int:
        """Streams started and not ended: in the rows, or parked by `pause`."""
        return len(self.streams) + len(self._parked)

    def pause(self, turn_id: str) -> None:
        """Stop stepping `turn_id` until `resume` (between steps only): its running stream, if any, is parked."""
        self._paused.add(turn_id)
        i = next((i for i, s in enumerate(self.streams) if s.job.turn_id == turn_id), None)
        if i is not None:
            with self._gpu.talker():
                self._parked[turn_id] = (self.streams[i], self.rows.copy(i))
                self._remove([i])

    def resume(self, turn_id: str) -> None:
        """Step `turn_id` again from the next step on (its parked stream first, when a row is free)."""
        self._paused.discard(turn_id)

    def forget(self, turn_id: str) -> None:
        """Drop a finished or cancelled turn's bookkeeping."""
        self.cancel(turn_id)
        self._job_count.pop(turn_id, None)

    def cancel(self, turn_id: str) -> None:
        self.queues.pop(turn_id, None)
        self._parked.pop(turn_id, None)
        self._paused.discard(turn_id)
        gone = [i for i, s in enumerate(self.streams) if s.job.turn_id == turn_id]
        if gone:
            with self._gpu.talker():
                self._remove(gone)

    def capture(self, progress: Progress | None = None) -> None:
        """Capture the per-bucket step and VAE graphs now (startup); no-op when eager. Else the first step does."""
        with torch.no_grad(), self._gpu.talker():
            self.stepper.capture(progress)
            with self._gpu.vae():
                self.vae_step.capture(progress)
            self.prefiller.capture()

    # ---- stepping ----------------------------------------------------------------------------
    def step(self) -> list[TalkerOutput]:
        return self.finish(self.launch())

    def launch(self, steps: int = 1, keep: bool = False) -> "_Launched":
        """Start queued jobs and queue `steps` talker steps of every stream back to back (LM + CFM + aggregator
        graphs) without waiting for them; the engine calls `finish` next (the thinker's next step runs beside
        them). A stream that ends before its last queued step keeps only the steps up to its end (the rest were
        computed for nothing). The audio is the same whatever `steps`.

        `keep`: the launch's outputs are copied out of graph memory, so one more `launch` may come before this
        one's `finish` (a pipelined talker: the GPU runs the next steps while the host reads these). Launches are
        finished in order; only `launch` may run between one and its `finish` (pause, cancel and forget wait)."""
        with self._gpu.talker():
            t0 = time.perf_counter()
            started = self._admit()
            self.counts["admit_s"] += time.perf_counter() - t0
            self.counts["jobs"] += sum(o.first_step for o in started)
            if not self.streams:
                return _Launched(started, [])
            with torch.no_grad():
                return _Launched(started, self._launch_advance(max(1, int(steps)), keep))

    def finish(self, launched: "_Launched") -> list[TalkerOutput]:
        """Wait for the launched steps: stop decisions, VAE chunks, each stream's PCM; retire ended streams."""
        if not launched.steps:
            return launched.started
        with self._gpu.talker(), torch.no_grad():
            return launched.started + self._finish_advance(launched.steps)

    def _admit(self) -> list[TalkerOutput]:
        """Put resumed streams back, then start the next job of every turn that has none running or parked and is not
        paused, while rows are free (FIFO by turn)."""
        started = []
        self._restore()
        running = {s.job.turn_id for s in self.streams} | self._parked.keys() | self._paused
        for turn_id, jobs in list(self.queues.items()):
            if not jobs:
                del self.queues[turn_id]
                continue
            if turn_id in running or len(self.streams) >= self.cfg.max_streams:
                continue
            job = jobs.popleft()
            try:
                with torch.no_grad():
                    self._start(job, jobs)
            except (ValueError, RuntimeError) as exc:
                self.queues.pop(turn_id, None)
                started.append(TalkerOutput(turn_id, job.segment_id, None, error=f"talker: {exc}"))
                continue
            started.append(TalkerOutput(turn_id, job.segment_id, None, first_step=True))
        return started

    def _restore(self) -> None:
        """Put resumed turns' parked streams back in the rows (state as they left it), while rows are free."""
        for turn_id in [t for t in self._parked if t not in self._paused]:
            if len(self.streams) >= self.cfg.max_streams:
                return
            stream, state = self._parked.pop(turn_id)
            self.rows.put(len(self.streams), state)
            self.streams.append(stream)

    def _start(self, job: _Job, queue: deque) -> None:
        voice, prompt_text = self._voice(job.voice)
        patches = voice.num_patches
        # the caption's tokens stay whatever the text's length: only the text part is worth halving
        fixed = 0 if job.caption is None else len(self._encode(job.caption)) + 1
        while True:
            prompt = build_talker_prompt(self._encode, self.bundle.talker_special, job.text,
                                         num_speakers=0 if voice.spk_embed is None else 1,
                                         prompt_text=prompt_text if patches else None, prompt_patches=patches,
                                         caption=job.caption)
            # text the reference front-end could not cut (no spaces, no punctuation) may not fit the
            # talker cache: speak it in halves rather than fail
            if len(prompt.input_ids) - fixed <= self.prompt_limit or len(job.text) < 2:
                break
            half = len(job.text) // 2
            queue.appendleft(replace(job, text=job.text[half:], first=False,
                                     seed=stream_seed(job.seed, 1)))  # not seed + 1: that is the next job's seed
            job = replace(job, text=job.text[:half])
        spk = [] if voice.spk_embed is None else [voice.spk_embed]
        embeds = self.talker.prompt_embeds(prompt, spk, voice.prompt_emb if patches else None)
        t = embeds.shape[1]
        if t >= self.cfg.max_prompt_len - 2:
            raise ValueError(f"talker prompt of {t} tokens exceeds engine.talker.max_prompt_len")
        if self.steps_per_word > 0:  # benchmarks: fixed length, stop head ignored
            max_steps = max(1, len(job.text.split()) * self.steps_per_word)
        else:
            max_steps = duration_step_cap(len(job.text), _SECONDS_PER_STEP)
        max_steps = min(max_steps, self.cfg.max_prompt_len - t - 1)
        # a lead's second step must be one the stop head cannot end (step 0 of at least two)
        lead = self.catch_up and job.first and max_steps >= 2
        r = self._make_room(lead)
        try:
            row = self.cache.rows(r, r + 1)
            head = self.heads.get(voice, prompt_text)
            start = 0 if head is None else min(head.shared(prompt.input_ids), t - 1)
            self.h[r] = self.prefiller(embeds, row, head if start else None, start)[0]
            if head is None:
                self._keep_head(voice, prompt_text, prompt, row)
            self.his[r] = initial_history(voice.prompt_lat, self.his.shape[1], self.his.shape[2],
                                          device=self.device, dtype=self.dtype)[0]
            self.rows.reset_vae(r, r + 1)
        except BaseException:
            if r < len(self.streams) - 1:  # the stream moved out of row r goes back
                self.rows.move(len(self.streams) - 1, r)
                self.streams.pop()
            raise
        silence = SilenceHolder(self.vae.cfg.sample_rate) if self.cfg.silence_holder else None
        generator = torch.Generator(device=self.device).manual_seed(job.seed)
        stream = _Stream(job, t, max_steps, silence=silence, generator=generator, lead=lead)
        if r == len(self.streams):
            self.streams.append(stream)
        else:
            self.streams[r] = stream

    def _make_room(self, lead: bool) -> int:
        """The row a new stream starts in: the next free one, or for a lead the row after the leads (rows
        0..leads-1, one graph batch), whose stream moves to the next free row first (one row move, no swap)."""
        r, leads = len(self.streams), sum(s.lead for s in self.streams)
        if not lead or leads == r:
            return r
        self.rows.move(leads, r)
        self.streams.append(self.streams[leads])
        return leads

    def _keep_head(self, voice, prompt_text: str, prompt, row) -> None:
        """Cache the K/V of `voice`'s prompt head (every token before the reply text) from `row`, just
        prefilled with `prompt`: later jobs in this voice prefill only the rest. The head's ids are that
        prompt's own (a music-caption text has no ` Text input:` line), so they always name the K/V kept."""
        self.heads.put(voice, prompt_text, prompt.input_ids[:prompt.text_start], row)

    def _voice(self, voice: str | CustomVoice) -> tuple:
        """(VoicePrompt, transcript) of a checkpoint voice's name or of a cloned voice."""
        if isinstance(voice, CustomVoice):
            return self.replica.voices(voice.prompt), voice.prompt_text
        prompt, text = self.bundle.voices[voice]
        return self.replica.voices(prompt), text  # the voice on this replica's device (copied once)

    def _launch_advance(self, steps: int, keep: bool) -> list:
        """Queue `steps` steps of every stream (with one step, leads that started now still get their second,
        over rows 0..leads-1) -> each queued step (`QueuedStep`), in order."""
        rows = [len(self.streams)] * (steps - 1)
        leads = sum(s.lead for s in self.streams)
        if not rows and leads:
            rows = [leads]
        queued = []
        for i, n in enumerate([len(self.streams)] + rows):
            # out of graph memory when another replay comes before `finish` (the next step here, or a kept launch)
            queued.append(QueuedStep.queue(*self._advance(self.streams[:n]), keep=keep or i < len(rows)))
        for s in self.streams:  # a lead's second step is queued
            s.lead = False
        self.counts["steps"] += len(queued)
        self.counts["rows"] += len(self.streams) + sum(rows)
        return queued

    def _advance(self, streams: list[_Stream]) -> tuple:
        """One talker step of rows 0..len(streams)-1, after each stream's steps already queued (a stream
        prefilled now decodes at its prompt's end, then on) -> (gen_lat, stop_prob, streams)."""
        n = len(streams)
        fresh = [s.fresh and not s.queued for s in streams]
        pos = upload([[-1 if f else s.pos + s.queued - int(s.fresh)] for s, f in zip(streams, fresh)],
                     torch.int64, self.device)  # [n, 1]
        y0, sde_rnd = self._noise(streams)
        gen_lat, next_embed, stop_prob, h, his = self.stepper(
            self.next_embed[:n], pos, upload(fresh, torch.bool, self.device), self.h[:n], self.his[:n], y0, sde_rnd,
            all_fresh=all(fresh))
        # graphed outputs are graph memory (valid until the next replay): the state keeps copies
        self.h[:n].copy_(h)
        self.his[:n].copy_(his)
        self.next_embed[:n].copy_(next_embed)
        for s in streams:
            s.queued += 1
        return gen_lat, stop_prob, list(streams)

    def _finish_advance(self, queued: list) -> list[TalkerOutput]:
        """Each queued step in order; a stream that ended keeps nothing of the steps after its end. Streams are
        matched by identity: rows may have moved since the launch (another launch's jobs, ended streams)."""
        ended: set[int] = set()
        pcm: dict[int, tuple[_Stream, list]] = {}  # by stream id, in the order the streams first took a step
        for step in queued:
            for s, chunk in self._collect(step, ended):
                pcm.setdefault(id(s), (s, []))[1].append(chunk)
        outputs = [TalkerOutput(s.job.turn_id, s.job.segment_id,
                                (p[0] if len(p) == 1 else torch.cat(p)).numpy().astype(np.float32, copy=False),
                                steps=len(p))
                   for s, p in pcm.values()]
        ending = [i for i, s in enumerate(self.streams) if id(s) in ended]
        if ending:  # their VAE rows were flushed (and, graphed, reset) by the step that ended them
            self._remove(ending)
        return outputs

    def _collect(self, step: QueuedStep, ended: set[int]) -> list[tuple[_Stream, torch.Tensor]]:
        """Stop decisions and the VAE chunk of one queued talker step over `step.rows` (the streams it stepped, by
        its rows) -> (stream, PCM) of each stream that took it. A stream that ended at an earlier step, in this
        finish (`ended`, its id added here when it ends) or before (no longer running), keeps nothing of it."""
        rows, gen_lat = step.rows, step.gen_lat
        p_stop = step.stop_probs()  # waits for this step's outputs: the stop decision needs them
        where = {id(s): i for i, s in enumerate(self.streams)}
        taken = []  # (row in the step, row now, stream)
        for j, s in enumerate(rows):
            s.queued -= 1
            if id(s) in ended or id(s) not in where:
                continue
            if not s.fresh:
                s.pos += 1
            s.fresh = False
            ends = s.step + 1 >= s.max_steps
            if self.steps_per_word <= 0:
                ends = ends or should_stop(s.step, p_stop[j])  # the model's stop rule (min_new_token 10)
            if ends:
                ended.add(id(s))
            s.step += 1
            taken.append((j, where[id(s)], s))
        if not taken:
            return []
        n = max(now for _, now, _ in taken) + 1
        last, active = [False] * n, [False] * n
        for _, now, s in taken:
            last[now], active[now] = id(s) in ended, True
        with self._gpu.vae(after=step):  # beside the talker's next step, if one is queued
            if [(j, now) for j, now, _ in taken] == [(i, i) for i in range(gen_lat.shape[0])]:
                pcm_rows = self.vae_step(gen_lat, last)  # the rows as launched (no pipelining): host float32 per row
            else:  # each latent to its stream's row now; the other rows' VAE state is left alone
                lat = gen_lat.new_zeros((n, *gen_lat.shape[1:]))
                src, dst = upload([[j for j, _, _ in taken], [now for _, now, _ in taken]], torch.int64, gen_lat.device)
                lat.index_copy_(0, dst, gen_lat[src])
                pcm_rows = self.vae_step(lat, last, active)
        return [(s, s.silence.push(pcm_rows[now], last[now]) if s.silence is not None else pcm_rows[now])
                for _, now, s in taken]

    def _noise(self, streams: list[_Stream]) -> tuple[torch.Tensor, torch.Tensor]:
        """y0 [n, P, C] and sde_rnd [S, n, P, C], each stream's drawn from its own generator in the
        reference order (y0, then the SDE noise): batching and graphs change nothing."""
        shape = (1, self.patch, self.talker.latent_dim)
        y0, sde_rnd = [], []
        for s in streams:
            y0.append(torch.randn(shape, generator=s.generator, device=self.device, dtype=self.dtype))
            sde_rnd.append(torch.randn((self.steps, *shape), generator=s.generator, device=self.device,
                                       dtype=self.dtype))
        return torch.cat(y0), torch.cat(sde_rnd, dim=1)

    def _remove(self, indices: list[int]) -> None:
        """Drop streams at `indices`, refilling each hole from the last row (descending order), the rows' state moved
        in one batch (`TalkerRows.moves`); the rows left empty start their VAE state afresh. Whatever a removed row
        held (flushed, reset or not) is overwritten by a move or reset."""
        if not indices:
            return
        n = len(self.streams)
        where = list(range(n))  # the row each row's content comes from
        for i in sorted(set(indices), reverse=True):
            last = len(self.streams) - 1
            if i != last:
                where[i] = where[last]
                self.streams[i] = self.streams[last]
            self.streams.pop()
        self.rows.moves([(src, dst) for dst, src in enumerate(where[:len(self.streams)]) if src != dst])
        self.rows.reset_vae(len(self.streams), n)
