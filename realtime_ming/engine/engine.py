"""The engine: one thread that steps thinker → segmenter → talker → VAE for every active turn.

Each step collects the thinker's step in flight and queues its next one, routes the text (`engine/turn_routing.py`),
then starts the talker's step (its own CUDA stream, beside the thinker's) and waits for it (`_step`): text routed to
the talker in one step is spoken from that same step. The talker is a driver (`engine/talker_driver.py`): stepped
inline by the engine thread, or in a process of its own per replica (`engine.talker.driver`).

The engine composes objects that own their state: the turn table and the delivery of each turn's events
(`engine/turn_table.py`), admission (`engine/admission.py`), speculation (`engine/speculation.py`) and routing,
each given the table; what is left here is the inbox, the thread and supervision.

Callers (the session layer, the SDK) submit `TurnRequest`s from any thread; commands (`engine/commands.py`)
enter through a thread-safe inbox and are applied at step boundaries, so a cancel never interrupts a
kernel. A submitted request is prepared at once by the input processor's worker threads (chat template,
tokens, media preprocessing: `engine/input_processor.py`); the engine thread admits it to the thinker
when both its Submit and its preparation are done (`engine/admission.py`). Each turn's events go to its
`sink`, called on the engine thread or a talker's reader thread (the sink must be cheap and thread-safe, e.g.
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
import threading
from concurrent.futures import Future
from typing import Callable

from .admission import Admission
from .api import EngineHealth, FailureCode, TurnCancelled, TurnRequest, TurnTask
from .commands import (Cancel, Capture, CloseConversation, Command, Confirm, Discard, EngineStats, InputsReady, Sink,
                       Stats, Stop, Submit, Wake)
from .config import EngineConfig
from .hooks import EngineHooks
from .models import ModelBundle
from .prompt_meter import PromptMeter
from .rejection import reject
from .speculation import Speculation
from .supervision import FaultLog, WorkerWatch, dead_workers, fault_injection_enabled
from .talker_pool import make_talker
from .thinker_runner import ThinkerRunner
from .turn_routing import Router, now_ms
from .turn_table import TurnTable
from .warmup import warm_up

__all__ = ["Engine", "EngineStats"]

log = logging.getLogger(__name__)


class Engine:
    """Owns the models and the engine thread. Create with `Engine.create(cfg)`; thread-safe API."""

    def __init__(self, cfg: EngineConfig, bundle: ModelBundle):
        cfg = cfg.fitted_to_tiny() if bundle.is_tiny_default else cfg
        self.cfg = cfg
        self.bundle = bundle
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thinker = ThinkerRunner(bundle, cfg, wake=lambda: self._put(Wake()))  # an admission's encoders finished
        self._stopping = False
        self._in_flight = None  # the thinker step queued at the end of the last engine step, collected by the next
        # `_dead` (None while serving) is set once, under the table's lock, which also orders every delivery to a sink,
        # so no command is queued after the engine died and a turn's terminal event is always its last
        self._dead: str | None = None
        self._table = TurnTable(FaultLog(log), self._release)
        fault_injection = fault_injection_enabled()
        if fault_injection:
            log.warning("engine fault injection is ON: a turn carrying the kill marker kills the engine thread")
        # the talker (`engine.talker.driver`; a pool over several replicas): a process talker delivers its PCM from
        # its reader thread, wakes the engine when it has notices and kills it when its process is gone
        self._talker = make_talker(bundle, cfg, self._deliver_talker, lambda: self._put(Wake()),
                                   self._worker_died) if bundle.has_talker else None
        self._router = Router(self._table, self._talker)
        self._admission = Admission(cfg, self._table, self._thinker, bundle.voices, self._talker is not None,
                                    fault_injection)
        self._speculation = Speculation(cfg, self._table, self._thinker, self._talker)
        self._thread = threading.Thread(target=self._main, name="realtime-ming-engine", daemon=True)
        self._thread.start()
        self._watch = WorkerWatch.start(bundle.thinker, self._worker_died)  # tensor-parallel workers, if any

    @classmethod
    def create(cls, cfg: EngineConfig, progress: Callable[[str, int, int], None] | None = None,
               warmup: bool = True, hooks: EngineHooks | None = None) -> "Engine":
        """Load the models (blocking; run off the event loop), start the engine thread, warm it up. `hooks`:
        test and benchmark substitutions (`engine/hooks.py`), never from a served config."""
        engine = cls(cfg, ModelBundle.load(cfg, progress=progress, hooks=hooks))
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
        if self._talker is not None:  # a talker stepped elsewhere delivers nothing more of the turn from now on
            self._talker.drop(turn_id)
        self._put(Discard(turn_id))

    def cancel(self, turn_id: str) -> None:
        if self._talker is not None:
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
        if self._talker is not None:
            self._talker.close()
        self._thinker.close()
        if stuck:
            log.error("engine thread did not stop; tensor-parallel workers are killed, the thread is left behind")
            abort = getattr(self.bundle.thinker, "abort", None)
            if callable(abort):
                abort()
            return
        self.bundle.close()

    # ---- supervision ----------------------------------------------------------------------------
    def _put(self, cmd: Command) -> None:
        with self._table.lock:
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
        with self._table.lock:
            if self._dead is not None:
                return
            self._dead = reason
            message = f"engine unavailable: {reason}"
            self._table.fail_all(message)
        while True:  # nothing is queued after `_dead` is set: this empties the inbox for good
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._reject(cmd, FailureCode.ENGINE_UNAVAILABLE, message)
        self._inbox.put(Wake())  # an idle engine thread waits on its inbox: it sees `_dead` and ends

    def _reject(self, cmd: Command, code: FailureCode, message: str) -> None:
        if reject(cmd, code, message, self._table, self._speculation):
            self._stopping = True

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
        table, admission = self._table, self._admission
        while not self._stopping and self._dead is None:
            try:
                # a step in flight is collected even when every row left is paused (its tokens are theirs)
                busy = bool(table.turns) and (self._in_flight is not None or self._thinker.has_work()
                                              or bool(admission.forks) or (self._talker and self._talker.has_work()))
                self._drain(block=not busy, timeout=self._idle_timeout())
                if self._stopping or self._dead is not None:
                    break
                if admission.forks:
                    admission.admit_forks()
                self._step()
            except Exception as exc:  # a model failure fails the turns in flight, not the engine
                dead = dead_workers(self.bundle.thinker)
                if dead is not None:  # the step's collective failed because a rank is gone: never again
                    self._worker_died(f"{dead} (seen as {type(exc).__name__} in a step)")
                    break
                table.faults.report("engine step", exc)
                self._in_flight = None  # its rows are failed below
                for turn_id, turn in list(table.turns.items()):
                    table.fail(turn_id, f"engine error: {type(exc).__name__}: {exc}", FailureCode.ENGINE_ERROR)
                    # the step may have stopped between a cache write and its bookkeeping: reprefill next time
                    table.guarded("invalidating a failed turn's cache", self._thinker.close_conversation,
                                  turn.request.conversation_id)
        table.parked.clear()

    def _idle_timeout(self) -> float | None:
        deadlines = [t.segmenter.deadline_ms() for t in self._table.turns.values() if t.segmenter is not None]
        deadlines = [d for d in deadlines if d is not None]
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - now_ms()) / 1000.0)

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
                    self._table.faults.report(f"engine command {name}", exc)
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
        table = self._table
        match cmd:
            case Submit(request=request, sink=sink):
                self._admission.admit(request, sink, cmd.prepared, now_ms())
            case InputsReady(turn_id=turn_id):
                turn = table.turns.get(turn_id)
                if turn is not None and turn.prepared is cmd.prepared:  # else cancelled, or admitted already
                    self._admission.admit_prepared(turn)
            case Confirm(turn_id=turn_id):
                self._speculation.confirm(turn_id)
            case Discard(turn_id=turn_id):
                self._speculation.discard(turn_id)
            case Cancel(turn_id=turn_id):
                table.parked.pop(turn_id, None)
                turn = table.turns.pop(turn_id, None)
                if turn is not None:  # the caller hears TurnCancelled even if freeing the rows fails
                    table.release(turn_id)
                    table.emit_terminal(turn, TurnCancelled(turn_id, turn.text))
            case CloseConversation(conversation_id=conversation_id):
                self._thinker.close_conversation(conversation_id)
            case Stats():
                preparing = sum(1 for t in table.turns.values() if t.prepared is not None)
                cmd.box.append(EngineStats(
                    len(table.turns) + len(table.parked), self._thinker.num_rows(),
                    self._talker.num_streams() if self._talker else 0, self._thinker.num_cached(),
                    self._inbox.qsize(), preparing, *self._speculation.held_stats()))
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
        # A talker stepped elsewhere (`engine.talker.driver: process`) queues nothing here: the engine takes what it
        # reported.
        if self._in_flight is None:
            self._in_flight = self._admission.launch()
        launched, self._in_flight = self._in_flight, None
        outputs = self._thinker.collect(launched)
        if self._thinker.has_work() or self._thinker.encoding():
            queued = self._admission.launch()
            # a launch that queued nothing to collect (only polling the encoders) is not a step in flight: `_run`
            # would otherwise spin on it while an admission is encoded, starving the encoder thread of the GIL
            self._in_flight = None if queued.idle else queued
        self._router.thinker_outputs(outputs)
        self._router.tick()
        if self._talker is not None:
            self._talker.launch()
            self._router.talker_outputs(self._talker.outputs())
        self._speculation.bound()  # between steps: a paused row or stream is simply not in the next one
        self._router.finish_done()

    def _deliver_talker(self, outputs: list) -> None:
        """A process talker's PCM, from its reader thread (`Router.deliver`)."""
        self._router.deliver(outputs)

    def _release(self, turn_id: str) -> None:
        """Free a turn's thinker row and talker streams (`TurnTable.release`)."""
        self._thinker.cancel(turn_id)
        if self._talker is not None:
            self._talker.forget(turn_id)
