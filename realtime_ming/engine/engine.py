"""The engine: one thread that steps thinker → segmenter → talker → VAE for every active turn.

Each step collects the thinker's step in flight and queues its next one, routes the text, then starts the
talker's step (its own CUDA stream, beside the thinker's) and waits for it (`_step`): text routed to the
talker in one step is spoken from that same step.

Callers (the session layer, the SDK) submit `TurnRequest`s from any thread; commands (`engine/commands.py`)
enter through a thread-safe inbox and are applied at step boundaries, so a cancel never interrupts a
kernel. A submitted request is prepared at once by the input processor's worker threads (chat template,
tokens, media preprocessing: `engine/input_processor.py`); the engine thread admits it to the thinker
when both its Submit and its preparation are done (`engine/admission.py`). Each turn's events go to its
`sink`, called on the engine thread (the sink must be cheap and thread-safe, e.g.
`loop.call_soon_threadsafe(queue.put_nowait, event)`).
Speculative turns run normally but their events are held until `confirm`; `discard` drops them. While
unconfirmed, a turn pauses once it holds its first audio lookahead, and its held events are released coalesced
(`engine/speculation.py`).

Supervision: a command that fails is reported to its caller alone (a turn whose admission raises ends
`TurnFailed` with a `FailureCode`: INVALID_PROMPT for content the model rejects, ENGINE_BUSY, or
ADMISSION_FAILED for anything unexpected); a failed step fails the turns in flight and the engine goes
on. If the engine thread itself dies (a BaseException, a bug in the loop) or a tensor-parallel worker
process exits, the engine is dead: every active turn and every later command ends at once with
ENGINE_UNAVAILABLE, and `health()` says why (the server turns that into 503s and a non-zero exit).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from typing import Callable

from .admission import Admission
from .api import (
    AudioChunk,
    EngineHealth,
    FailureCode,
    FinishReason,
    Stage,
    StageMark,
    TextDelta,
    TurnCancelled,
    TurnDone,
    TurnEvent,
    TurnFailed,
    TurnJudgement,
    TurnRequest,
    TurnTask,
)
from .commands import (Cancel, Capture, CloseConversation, Command, Confirm, Discard, EngineStats, InputsReady, Sink,
                       Stats, Stop, Submit, Wake)
from .config import EngineConfig
from .models import ModelBundle
from .prompt_meter import PromptMeter
from .speculation import Speculation
from .turn_state import TurnState as _Turn
from .warmup import warm_up
from .supervision import (
    FaultLog,
    WorkerWatch,
    dead_workers,
    fault_injection_enabled,
)
from .step_overlap import StepOverlap, overlap_steps
from .talker_loop import Idle, TalkerLoop
from .talker_pool import make_talker
from .talker_process import TalkerProcess, warn_shared_gpus
from .talker_runner import TalkerRunner
from .thinker_runner import ThinkerRunner

__all__ = ["Engine", "EngineStats"]

log = logging.getLogger(__name__)


class Engine(Admission, Speculation):
    """Owns the models and the engine thread. Create with `Engine.create(cfg)`; thread-safe API."""

    def __init__(self, cfg: EngineConfig, bundle: ModelBundle):
        cfg = cfg.fitted_to_tiny() if bundle.is_tiny_default else cfg
        self.cfg = cfg
        self.bundle = bundle
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._turns: dict[str, _Turn] = {}
        self._parked: dict[str, _Turn] = {}  # speculative turns that ended before confirm/discard
        self._forks: list[_Turn] = []  # prepared side requests waiting for their source's prefill (`fork_ready`)
        self._thinker = ThinkerRunner(bundle, cfg, wake=lambda: self._put(Wake()))  # an admission's encoders finished
        self._talker_notices: queue.SimpleQueue = queue.SimpleQueue()  # from a talker on its own thread
        self._stopping = False
        self._in_flight = None  # the thinker step queued at the end of the last engine step, collected by the next
        self._overlap = StepOverlap(overlap_steps(cfg) if bundle.has_talker else 0, cfg.talker.thinker_delay)
        # `_dead` (None while serving) is set once, under `_lock`, which also orders every delivery to a sink, so
        # no command is queued after the engine died and a turn's terminal event is always its last
        self._lock = threading.RLock()
        self._dead: str | None = None
        self._faults = FaultLog(log)
        self._fault_injection = fault_injection_enabled()
        if self._fault_injection:
            log.warning("engine fault injection is ON: a turn carrying the kill marker kills the engine thread")
        # the talker (a pool over several replicas); `engine.talker.own_thread`: each replica steps on a thread of its
        # own (`own_process`: in a process of its own)
        self._threaded = bundle.has_talker and cfg.talker.own_thread
        member = None
        if self._threaded and cfg.talker.own_process:
            warn_shared_gpus(bundle, cfg)
            member = lambda replica: TalkerProcess(bundle, cfg, replica, self._deliver_talker,  # noqa: E731
                                                   self._notice, self._worker_died)
        elif self._threaded:
            member = lambda replica: TalkerLoop(TalkerRunner(bundle, cfg, replica),  # noqa: E731
                                                self._deliver_talker, self._notice, self._worker_died,
                                                steps=cfg.talker.thread_steps, pipeline=cfg.talker.thread_pipeline)
        self._switch_interval = sys.getswitchinterval()  # `engine.switch_interval_ms`: set back on close
        if cfg.switch_interval_ms is not None:
            sys.setswitchinterval(cfg.switch_interval_ms / 1e3)
        self._talker = make_talker(bundle, cfg, member) if bundle.has_talker else None
        self._thread = threading.Thread(target=self._main, name="realtime-ming-engine", daemon=True)
        self._thread.start()
        self._watch = WorkerWatch.start(bundle.thinker, self._worker_died)  # tensor-parallel workers, if any

    @classmethod
    def create(cls, cfg: EngineConfig, progress: Callable[[str, int, int], None] | None = None,
               warmup: bool = True) -> "Engine":
        """Load the models (blocking; run off the event loop), start the engine thread, warm it up."""
        engine = cls(cfg, ModelBundle.load(cfg, progress=progress))
        engine.capture(progress)
        if warmup:
            engine.warmup()
        return engine

    def capture(self, progress: Callable[[str, int, int], None] | None = None, timeout_s: float = 1800.0) -> None:
        """Capture the runners' CUDA graphs on the engine thread (no-op on CPU / enforce_eager)."""
        cmd = Capture(progress)
        self._put(cmd)
        if not cmd.done.wait(timeout_s):
            raise RuntimeError(f"CUDA-graph capture did not finish within {timeout_s:.0f} s")
        if cmd.errors:  # a server must not start half-captured: the caller sees the failure
            raise RuntimeError(f"CUDA-graph capture failed: {cmd.errors[0]}") from cmd.errors[0]

    def warmup(self, timeout_s: float = 300.0) -> None:
        """Pay first-call costs at startup, not on the first user's turn (`engine/warmup.py`)."""
        warm_up(self, timeout_s)

    # ---- thread-safe API -------------------------------------------------------------------
    def submit(self, request: TurnRequest, sink: Sink) -> None:
        """Start a turn; on a dead engine `sink` gets TurnFailed(ENGINE_UNAVAILABLE) at once, on this thread.
        Its inputs are prepared from now on, off the engine thread."""
        if self._dead is not None:
            prepared: Future = Future()
            prepared.cancel()
        else:
            prepared = self._thinker.inputs.submit(request)
            prepared.add_done_callback(lambda f, turn_id=request.turn_id: self._put(InputsReady(turn_id, f)))
        self._put(Submit(request, sink, prepared))

    def confirm(self, turn_id: str) -> None:
        self._put(Confirm(turn_id))

    def discard(self, turn_id: str) -> None:
        if self._threaded:  # its thread delivers nothing more of the turn from now on
            self._talker.drop(turn_id)
        self._put(Discard(turn_id))

    def cancel(self, turn_id: str) -> None:
        if self._threaded:
            self._talker.drop(turn_id)
        self._put(Cancel(turn_id))

    def close_conversation(self, conversation_id: str) -> None:
        self._put(CloseConversation(conversation_id))

    def health(self) -> EngineHealth:
        """Alive, or dead with the reason (thread died, a tensor-parallel worker exited, closed). Any thread."""
        reason = self._dead
        if reason is None and not self._thread.is_alive():
            reason = "engine thread is not running"
        return EngineHealth(reason is None, reason)

    def info(self) -> dict:
        meter = self._thinker.meter
        return {**self.bundle.info(), "turn_judgement": self.supports(TurnTask.JUDGE_TURN),
                "prompt": {"max_seq_len": meter.max_seq_len, "caption_budget": meter.caption_budget}}

    def prompt_meter(self) -> PromptMeter:
        """Measures instructions, tools and speech styles in tokens (`api.PromptMeter`; any thread but the engine's)."""
        return self._thinker.meter

    def supports(self, task: TurnTask) -> bool:
        """Whether this engine runs turns of `task` (JUDGE_TURN: `engine.thinker.turn_judgement`)."""
        return task is not TurnTask.JUDGE_TURN or self._thinker.judge_answers is not None

    def voices(self) -> list[str]:
        return list(self.bundle.voices)

    def voice_encoder(self):
        """Registers cloned voices (`voice_prompt.VoiceEncoder`; call it off the engine thread); None without a talker."""
        return self.bundle.voice_encoder if self._talker is not None else None

    def stats(self) -> EngineStats:
        """Snapshot after every command sent so far has been applied (blocks up to 10 s)."""
        cmd = Stats([])
        self._put(cmd)
        cmd.done.wait(10.0)
        return cmd.box[0] if cmd.box else EngineStats(-1, -1, -1, -1, -1, -1)

    def close(self) -> None:
        """Stop the thread; active turns end with TurnFailed(ENGINE_UNAVAILABLE, "engine stopped"). Idempotent.

        A dead engine closes at once: its thread is given a second (it may be stuck in a collective with a
        dead tensor-parallel worker), then the surviving workers are killed rather than stopped."""
        if self._watch is not None:
            self._watch.stop()
        if self._thread.is_alive():
            self._put(Stop())
            self._thread.join(timeout=30 if self._dead is None else 1)
        stuck = self._thread.is_alive()
        self._die("engine closed")
        if self._threaded:
            self._talker.close()
        self._thinker.close()
        if self.cfg.switch_interval_ms is not None:
            sys.setswitchinterval(self._switch_interval)
        if stuck:
            log.error("engine thread did not stop; tensor-parallel workers are killed, the thread is left behind")
            abort = getattr(self.bundle.thinker, "abort", None)
            if callable(abort):
                abort()
            return
        self.bundle.close()

    # ---- supervision ----------------------------------------------------------------------------
    def _put(self, cmd: Command) -> None:
        with self._lock:
            if self._dead is None:
                self._inbox.put(cmd)
                return
            reason = self._dead
        self._reject(cmd, FailureCode.ENGINE_UNAVAILABLE, f"engine unavailable: {reason}")

    def _worker_died(self, reason: str) -> None:
        """WorkerWatch thread: a tensor-parallel rank is gone, so the engine can never step again."""
        log.critical("engine dead: %s", reason)
        self._die(reason)

    def _die(self, reason: str) -> None:
        """Mark the engine dead (first reason wins): fail every turn and every queued command. Any thread."""
        with self._lock:
            if self._dead is not None:
                return
            self._dead = reason
            message = f"engine unavailable: {reason}"
            for turn_id, turn in dict(self._turns).items():  # a copy: the engine thread may be stuck mid-step
                self._terminal(turn_id, turn, TurnFailed(turn_id, message, FailureCode.ENGINE_UNAVAILABLE))
            self._turns.clear()
        while True:  # nothing is queued after `_dead` is set: this empties the inbox for good
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._reject(cmd, FailureCode.ENGINE_UNAVAILABLE, message)
        self._inbox.put(Wake())  # an idle engine thread waits on its inbox: it sees `_dead` and ends

    def _reject(self, cmd: Command, code: FailureCode, message: str) -> None:
        """Report a command that could not be applied to its caller (a terminal event, an error, a wake-up)."""
        match cmd:
            case Submit(request=request, sink=sink):
                cmd.prepared.cancel()
                turn = self._turns.get(request.turn_id)
                if turn is not None and turn.sink is sink:
                    self._fail(request.turn_id, message, code)
                else:
                    self._call_sink(sink, TurnFailed(request.turn_id, message, code))
            case InputsReady(turn_id=turn_id):
                turn = self._turns.get(turn_id)
                if turn is not None and turn.prepared is cmd.prepared:
                    self._fail(turn_id, message, code)
            case Confirm(turn_id=turn_id) | Cancel(turn_id=turn_id) | Discard(turn_id=turn_id):
                parked = self._parked.pop(turn_id, None)
                if parked is not None and isinstance(cmd, Confirm):
                    self._deliver_held(parked)
                turn = self._turns.get(turn_id)
                if turn is not None:  # a live turn whose command failed: it still ends, and its caller hears of it
                    if isinstance(cmd, Discard):
                        turn.held = []  # silent, as a discard is
                    elif isinstance(cmd, Confirm) and turn.held is not None:
                        self._deliver_held(turn)
                    self._fail(turn_id, message, code)
                    self._parked.pop(turn_id, None)
            case Stats():
                cmd.done.set()
            case Capture():
                cmd.errors.append(RuntimeError(message))
                cmd.done.set()
            case Stop():
                self._stopping = True

    def _call_sink(self, sink: Sink, event: TurnEvent) -> None:
        """Deliver one event; a sink that raises is the caller's bug: logged, never the engine's death."""
        try:
            sink(event)
        except Exception as exc:
            self._faults.report("a turn's event sink", exc)

    # ---- engine thread -----------------------------------------------------------------------
    def _main(self) -> None:
        reason = "engine stopped"
        try:
            self._run()
        except BaseException as exc:  # noqa: B036 - the thread is dying: fail every turn, never leave one hanging
            reason = f"engine thread died ({type(exc).__name__}: {exc})"
            log.critical("engine dead: %s", reason, exc_info=exc)
        finally:
            self._die(reason)

    def _run(self) -> None:
        while not self._stopping and self._dead is None:
            try:
                # a step in flight is collected even when every row left is paused (its tokens are theirs)
                busy = bool(self._turns) and (self._in_flight is not None or self._thinker.has_work()
                                              or bool(self._forks) or (self._talker and self._talker.has_work()))
                self._drain(block=not busy, timeout=self._idle_timeout())
                if self._stopping or self._dead is not None:
                    break
                if self._forks:
                    self._admit_forks()
                self._step()
            except Exception as exc:  # a model failure fails the turns in flight, not the engine
                dead = dead_workers(self.bundle.thinker)
                if dead is not None:  # the step's collective failed because a rank is gone: never again
                    self._worker_died(f"{dead} (seen as {type(exc).__name__} in a step)")
                    break
                self._faults.report("engine step", exc)
                self._in_flight = None  # its rows are failed below
                for turn_id, turn in list(self._turns.items()):
                    self._fail(turn_id, f"engine error: {type(exc).__name__}: {exc}", FailureCode.ENGINE_ERROR)
                    # the step may have stopped between a cache write and its bookkeeping: reprefill next time
                    self._guarded("invalidating a failed turn's cache", self._thinker.close_conversation,
                                  turn.request.conversation_id)
        self._parked.clear()

    def _guarded(self, place: str, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._faults.report(place, exc)

    def _idle_timeout(self) -> float | None:
        deadlines = [t.segmenter.deadline_ms() for t in self._turns.values() if t.segmenter is not None]
        deadlines = [d for d in deadlines if d is not None]
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - self._now_ms()) / 1000.0)

    @staticmethod
    def _now_ms() -> float:
        return time.monotonic() * 1000.0

    def _drain(self, block: bool, timeout: float | None) -> None:
        try:
            cmd = self._inbox.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return
        while True:
            if self._dead is not None:  # died meanwhile (a worker exited): nothing more is applied
                self._reject(cmd, FailureCode.ENGINE_UNAVAILABLE, f"engine unavailable: {self._dead}")
            else:
                try:
                    self._apply(cmd)
                except Exception as exc:  # one command's failure is reported to its caller alone
                    name = type(cmd).__name__
                    self._faults.report(f"engine command {name}", exc)
                    admitting = isinstance(cmd, (Submit, InputsReady))
                    code = FailureCode.ADMISSION_FAILED if admitting else FailureCode.ENGINE_ERROR
                    self._reject(cmd, code, f"{name} failed: {type(exc).__name__}: {exc}")
            if self._stopping:
                return
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: Command) -> None:
        match cmd:
            case Submit(request=request, sink=sink):
                self._admit(request, sink, cmd.prepared)
            case InputsReady(turn_id=turn_id):
                turn = self._turns.get(turn_id)
                if turn is not None and turn.prepared is cmd.prepared:  # else cancelled, or admitted already
                    self._admit_prepared(turn)
            case Confirm(turn_id=turn_id):
                self._confirm(turn_id)
            case Discard(turn_id=turn_id):
                self._discard(turn_id)
            case Cancel(turn_id=turn_id):
                self._parked.pop(turn_id, None)
                turn = self._turns.pop(turn_id, None)
                if turn is not None:  # the caller hears TurnCancelled even if freeing the rows fails
                    self._guarded(f"releasing turn {turn_id}", self._release, turn_id)
                    self._emit_terminal(turn, TurnCancelled(turn_id, turn.text))
            case CloseConversation(conversation_id=conversation_id):
                self._thinker.close_conversation(conversation_id)
            case Stats():
                preparing = sum(1 for t in self._turns.values() if t.prepared is not None)
                cmd.box.append(EngineStats(
                    len(self._turns) + len(self._parked), self._thinker.num_rows(),
                    self._talker.num_streams() if self._talker else 0, self._thinker.num_cached(),
                    self._inbox.qsize(), preparing, *self._held_stats()))
                cmd.done.set()
            case Capture(progress=progress):
                try:
                    self._thinker.capture(progress)
                    if self._talker is not None:
                        self._talker.capture(progress)
                except Exception as exc:  # reported to Engine.capture's caller; the engine thread lives on
                    log.exception("CUDA-graph capture failed")
                    cmd.errors.append(exc)
                finally:
                    cmd.done.set()
            case Stop():
                self._stopping = True
            case Wake():  # the step that follows completes the admissions whose encoders finished
                pass

    def _step(self) -> None:
        # Pipelined: thinker step k is in flight when this starts (else it is queued now). It is collected, step k+1
        # is queued at once, and the host routes step k's text (segmenter, tool calls, events) while the GPU(s) run
        # it; then the talker starts the jobs of every segment routed so far, this step's included, and queues its
        # step beside the thinker's (own CUDA stream), and the engine waits for the talker's step (stop decisions,
        # VAE, PCM). A segment's first talker step is thus the step that produced its text: admitting jobs before
        # collecting the thinker (the talker launched first) would hold every new segment back one whole step.
        # A talker on GPUs of its own queues more steps while the thinker's step is still running (`StepOverlap`).
        if self._in_flight is None:
            self._in_flight = self._launch()
            self._overlap.launched(self._in_flight)
        launched, self._in_flight = self._in_flight, None
        waited = self._overlap.before_collect(launched)
        outputs = self._thinker.collect(launched)
        self._overlap.collected(launched, waited)
        if self._thinker.has_work() or self._thinker.encoding():
            queued = self._launch()
            # a launch that queued nothing to collect (only polling the encoders) is not a step in flight: `_run`
            # would otherwise spin on it while an admission is encoded, starving the encoder thread of the GIL
            self._in_flight = None if queued.idle else queued
            self._overlap.launched(self._in_flight)
        for out in outputs:
            turn = self._turns.get(out.turn_id)
            if turn is None:
                continue
            if out.prefill_done:
                turn.usage = (out.prompt_tokens, out.cached_tokens, 0)
                turn.by_modality = (out.prompt, out.cached)
                self._mark(turn, Stage.PREFILL_DONE)
            if out.text:
                if Stage.FIRST_TOKEN not in turn.stages:
                    self._mark(turn, Stage.FIRST_TOKEN)
                self._route_text(turn, turn.tool_parser.feed(out.text) if turn.tool_parser else [out.text])
            if out.p_complete is not None:
                self._emit(turn, TurnJudgement(out.turn_id, out.p_complete))
            if out.finish is not None:
                if turn.tool_parser is not None:
                    self._route_text(turn, turn.tool_parser.finish())
                turn.thinker_done = True
                turn.finish = out.finish
                turn.usage = (turn.usage[0], turn.usage[1], out.output_tokens)
                self._mark(turn, Stage.THINKER_DONE)
                if turn.segmenter is not None:
                    self._route_segments(turn, turn.segmenter.finish(self._now_ms()))
        now = self._now_ms()
        for turn in list(self._turns.values()):
            if turn.segmenter is not None and not turn.thinker_done:
                self._route_segments(turn, turn.segmenter.tick(now))
        if self._threaded:  # it steps on its own thread: take what it reported
            self._take_notices()
        elif self._talker is not None:
            # a talker on GPUs of its own runs more steps while the thinker's step still runs (`StepOverlap`)
            self._talker_step(self._overlap.talker_steps(self._in_flight))
        self._bound_speculation()  # between steps: a paused row or stream is simply not in the next one
        for turn_id, turn in list(self._turns.items()):
            if turn.thinker_done and (self._talker is None or not self._talker.pending(turn_id)):
                self._finish(turn_id, turn)

    def _talker_step(self, steps: int) -> None:
        """`steps` talker steps (every replica's, queued back to back): start queued jobs, wait, deliver the PCM."""
        started = time.perf_counter()
        outputs = self._talker.finish(self._talker.launch(steps))
        for out in outputs:
            if out.error is not None:
                self._fail(out.turn_id, out.error, FailureCode.ENGINE_ERROR)
        self._deliver_talker([out for out in outputs if out.error is None])
        self._overlap.talker_stepped(time.perf_counter() - started, steps)

    def _notice(self, events: list) -> None:
        """A talker on its own thread reports turns whose talker work failed or is done: the engine thread acts."""
        self._talker_notices.put(events)
        self._put(Wake())

    def _take_notices(self) -> None:
        while True:
            try:
                events = self._talker_notices.get_nowait()
            except queue.Empty:
                return
            for event in events:
                if isinstance(event, Idle):
                    self._talker.idle(event)
                else:
                    self._fail(event.turn_id, event.message, FailureCode.ENGINE_ERROR)

    def _deliver_talker(self, outputs: list) -> None:
        """Talker outputs to their turns: stage marks, step counts, PCM (the engine thread, or a talker's own)."""
        for out in outputs:
            turn = self._turns.get(out.turn_id)
            if turn is None:
                continue
            if out.first_step and Stage.FIRST_TALKER_STEP not in turn.stages:
                self._mark(turn, Stage.FIRST_TALKER_STEP)
            if out.pcm is not None:  # talker steps of this turn (their PCM may be held back as silence)
                turn.talker_steps += out.steps
            if out.pcm is not None and out.pcm.size:
                if Stage.FIRST_PCM not in turn.stages:
                    self._mark(turn, Stage.FIRST_PCM)
                turn.audio_samples += int(out.pcm.size)
                self._emit(turn, AudioChunk(turn.request.turn_id, out.pcm, segment_id=out.segment_id))

    def _route_segments(self, turn: _Turn, segments) -> None:
        for seg in segments:
            if Stage.FIRST_SEGMENT not in turn.stages:
                self._mark(turn, Stage.FIRST_SEGMENT)
            self._talker.enqueue(turn.request.turn_id, seg.segment_id, seg.text, turn.request.voice,
                                 seed=turn.request.sampling.seed, caption=turn.request.caption)

    def _mark(self, turn: _Turn, stage: Stage) -> None:
        t = time.monotonic()
        turn.stages[stage] = t
        self._emit(turn, StageMark(turn.request.turn_id, stage, t))

    def _emit(self, turn: _Turn, event: TurnEvent) -> None:
        with self._lock:
            if turn.ended:
                return
            if turn.held is not None:
                turn.held.append(event)
            else:
                self._call_sink(turn.sink, event)

    def _emit_terminal(self, turn: _Turn, event: TurnEvent) -> None:
        with self._lock:
            if turn.ended:
                return
            turn.ended = True
            if turn.held is None:  # an unconfirmed speculative turn ends silently
                self._call_sink(turn.sink, event)

    def _route_text(self, turn: _Turn, pieces: list) -> None:
        """Spoken text to the client and the segmenter; function-call events to the client only."""
        for piece in pieces:
            if not isinstance(piece, str):
                self._emit(turn, piece)
            elif piece:
                turn.text += piece
                self._emit(turn, TextDelta(turn.request.turn_id, piece))
                if turn.segmenter is not None:
                    self._route_segments(turn, turn.segmenter.push(piece, self._now_ms()))

    def _release(self, turn_id: str) -> None:
        self._thinker.cancel(turn_id)
        if self._talker is not None:
            self._talker.forget(turn_id)

    def _finish(self, turn_id: str, turn: _Turn) -> None:
        self._mark(turn, Stage.DONE)
        prompt, cached, output = turn.usage
        self._end(turn_id, turn, TurnDone(turn_id, turn.text, turn.finish or FinishReason.STOP, prompt, cached,
                                          output, turn.audio_samples, dict(turn.stages), *turn.by_modality,
                                          talker_steps=turn.talker_steps))

    def _fail(self, turn_id: str, message: str, code: FailureCode) -> None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            self._end(turn_id, turn, TurnFailed(turn_id, message, code))

    def _end(self, turn_id: str, turn: _Turn, event: TurnEvent) -> None:
        """Free the turn's rows and deliver its terminal event (parked while speculative)."""
        self._turns.pop(turn_id, None)
        self._guarded(f"releasing turn {turn_id}", self._release, turn_id)
        self._terminal(turn_id, turn, event)

    def _terminal(self, turn_id: str, turn: _Turn, event: TurnEvent) -> None:
        with self._lock:
            if turn.ended:
                return
            turn.ended = True
            if turn.held is not None:
                turn.held.append(event)
                self._parked[turn_id] = turn
            else:
                self._call_sink(turn.sink, event)
