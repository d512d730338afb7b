"""Talker data parallelism (`engine.placement.talker_devices`, engine/talker_pool.py) on CPU with two replicas:
the replicas hold the same tensors; every turn spoken through the pool has the PCM the single runner gives it
(several turns at once, spread over both replicas, a cloned voice on both, a turn cancelled on either replica);
turns stay on the replica chosen at their first segment, the least loaded; the placement is validated with
errors that say what to write instead; the engine and its info() run on the pool."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import torch

from realtime_ming.engine import Engine
from realtime_ming.engine.api import AudioChunk, Content, Message, SamplingParams, TurnDone, TurnFailed, TurnRequest
from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.segmenter import SegmenterConfig
from realtime_ming.engine.talker_driver import Enqueue
from realtime_ming.engine.talker_inline import InlineTalker
from realtime_ming.engine.talker_pool import TalkerPool, make_talker
from realtime_ming.engine.talker_process import ProcessTalker
from realtime_ming.engine.talker_replica import VoiceCopies
from realtime_ming.engine.talker_runner import TalkerRunner
from realtime_ming.engine.voice_store import CustomVoice
from realtime_ming.model.talker import VoicePrompt

pytestmark = pytest.mark.timeout(60)

TWO = PlacementConfig(talker_devices=("cpu", "cpu"))
ATOL = 1e-5  # a stream's audio is batch-invariant up to float rounding (CPU matmuls of other batch sizes)
# turn -> (text, seed, the runner step it is enqueued at); lengths differ so streams end at different steps
TURNS = {"a": ("One two three four five.", 1, 0), "b": ("Four five.", 2, 0), "c": ("Six seven eight nine.", 3, 1),
         "d": ("Ten eleven.", 4, 2)}


def _cfg(**talker) -> EngineConfig:
    return EngineConfig(placement=TWO, talker=TalkerRunnerConfig(**(dict(max_streams=4, silence_holder=False)
                                                                    | talker)))


@pytest.fixture(scope="module")
def pool_bundle() -> ModelBundle:
    return ModelBundle.load(EngineConfig(placement=TWO), hooks=EngineHooks(steps_per_word=1))


def _inline(bundle: ModelBundle, cfg: EngineConfig) -> InlineTalker:
    """The single runner, as the engine drives it (`engine.talker.driver: inline`)."""
    return InlineTalker(TalkerRunner(bundle, cfg))


def _pool(bundle: ModelBundle, cfg: EngineConfig | None = None):
    """The engine's talker over every replica of `bundle` (inline drivers: nothing is delivered elsewhere)."""
    return make_talker(bundle, cfg or _cfg(), lambda outputs: None, lambda: None, lambda reason: None)


def _step(talker) -> list:
    talker.launch()
    return talker.outputs()


def _drive(talker, turns=TURNS, voice=None, cancel: tuple[str, int] | None = None) -> dict[str, np.ndarray]:
    """Enqueue each turn at its step, step until no work is left; PCM per turn. `cancel` = (turn, step):
    that turn is cancelled and forgotten after that step."""
    pcm, step = defaultdict(list), 0
    last = max(at for _, _, at in turns.values())
    while step <= last or talker.has_work():
        for turn_id, (text, seed, at) in turns.items():
            if at == step:
                talker.enqueue(Enqueue(turn_id, 0, text, voice, seed))
        for out in _step(talker):
            assert out.error is None, out.error
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
        if cancel is not None and cancel[1] == step:
            talker.forget(cancel[0])
        step += 1
    return {t: np.concatenate(chunks) for t, chunks in pcm.items()}


def _assert_same_audio(got: dict, want: dict, turns) -> None:
    for turn_id in turns:
        assert got[turn_id].shape == want[turn_id].shape, turn_id
        assert got[turn_id].size > 0
        np.testing.assert_allclose(got[turn_id], want[turn_id], rtol=0, atol=ATOL, err_msg=turn_id)


def test_replicas_hold_copies_of_the_same_tensors(pool_bundle):
    first, second = pool_bundle.talker_replicas
    assert (first.talker, first.vae) == (pool_bundle.talker, pool_bundle.vae)
    for a, b in ((first.talker, second.talker), (first.vae, second.vae)):
        assert a is not b
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and sa
        for name in sa:
            assert sa[name].data_ptr() != sb[name].data_ptr(), name  # a copy, not shared storage
            assert torch.equal(sa[name], sb[name]), name
    assert pool_bundle.info()["talker_devices"] == ["cpu", "cpu"]
    assert isinstance(_pool(pool_bundle), TalkerPool)
    assert type(_pool(ModelBundle.load(EngineConfig()))) is InlineTalker  # one device: the replica's driver alone


def test_pool_speaks_every_turn_as_the_single_runner_and_balances(pool_bundle):
    want = _drive(_inline(pool_bundle, _cfg()))
    pool = _pool(pool_bundle)
    placed = {}
    original = pool.enqueue

    def enqueue(op):
        original(op)
        placed[op.turn_id] = pool.replica_of(op.turn_id)

    pool.enqueue = enqueue
    got = _drive(pool)
    _assert_same_audio(got, want, TURNS)
    # a, b arrive together (replicas 0, 1); c next: both hold one live turn, but b (two steps, both run in its
    # first engine step) has ended its stream while a still runs, so replica 1; d: replica 0 holds fewer turns
    assert placed == {"a": 0, "b": 1, "c": 1, "d": 0}
    assert all(m.num_streams() == 0 for m in pool.members)


def test_assignment_is_sticky_and_forget_frees_the_replica(pool_bundle):
    pool = _pool(pool_bundle)
    pool.enqueue(Enqueue("x", 0, "Hello there.", None, 1))
    pool.enqueue(Enqueue("y", 0, "Hi.", None, 2))
    assert (pool.replica_of("x"), pool.replica_of("y")) == (0, 1)
    while pool.has_work():  # both speak their first segment to the end
        _step(pool)
    assert not pool.pending("x") and not pool.pending("y")
    pool.enqueue(Enqueue("z", 0, "Third.", None, 3))  # both replicas hold a live turn: the lower index
    assert pool.replica_of("z") == 0
    pool.enqueue(Enqueue("y", 1, "More from y.", None, 2))  # y's next segment stays on its replica
    assert pool.replica_of("y") == 1 and pool.pending("y") and pool.members[1].pending("y")
    assert not pool.members[0].pending("y")
    pool.forget("x")
    assert pool.replica_of("x") is None and not pool.pending("x")
    pool.enqueue(Enqueue("w", 0, "Fourth.", None, 4))  # replica 0 has only z now, replica 1 has y: the lower index
    assert pool.replica_of("w") == 0
    pool.forget("y")
    pool.enqueue(Enqueue("v", 0, "Fifth.", None, 5))  # replica 1 is empty now
    assert pool.replica_of("v") == 1
    for turn_id in ("z", "w", "v"):
        pool.forget(turn_id)
    assert not pool.has_work() and pool.num_streams() == 0


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["a", "c"])  # a is on replica 0, c on replica 1
def test_cancel_on_either_replica_leaves_the_other_turns_audio(pool_bundle, victim):
    want = _drive(_inline(pool_bundle, _cfg()))
    pool = _pool(pool_bundle)
    got = _drive(pool, cancel=(victim, 1))
    assert victim in got and got[victim].size < want[victim].size  # it spoke, then stopped
    _assert_same_audio(got, want, [t for t in TURNS if t != victim])
    assert pool.replica_of(victim) is None and not pool.pending(victim)


def test_a_cloned_voice_speaks_on_both_replicas(pool_bundle):
    enc = pool_bundle.voice_encoder
    wave = torch.from_numpy(np.random.default_rng(3).standard_normal(enc.vae_rate_hz).astype(np.float32) * 0.1)
    prompt = enc.encode(wave, enc.vae_rate_hz, "Hello.", lambda w, a, b: w)
    voice = CustomVoice("voice_pool", "owner", "pool", prompt, "Hello.", 1.0, 0)
    turns = {"a": ("One two.", 1, 0), "b": ("Three four.", 2, 0)}
    want = _drive(_inline(pool_bundle, _cfg()), turns, voice)
    pool = _pool(pool_bundle)
    got = _drive(pool, turns, voice)
    _assert_same_audio(got, want, turns)
    preset = _drive(_inline(pool_bundle, _cfg()), {"a": turns["a"]})
    assert not np.allclose(got["a"][:preset["a"].size], preset["a"][:got["a"].size])  # the clone's voice, not the preset's
    assert {t: pool.replica_of(t) for t in turns} == {"a": 0, "b": 1}  # both replicas spoke in it


def test_voice_copies_move_each_voice_once_and_drop_it_with_the_voice():
    copies = VoiceCopies("meta")  # another device than the voices' (no second device on a CPU machine)
    voice = VoicePrompt(torch.randn(1, 4), torch.randn(1, 8, 2), torch.randn(1, 2, 4))
    moved = copies(voice)
    assert moved is not voice and moved.prompt_lat.device.type == "meta"
    assert moved.spk_embed.device.type == "meta" and moved.prompt_emb.shape == voice.prompt_emb.shape
    assert copies(voice) is moved and len(copies) == 1  # cached: the runner's head cache keys on identity
    bare = VoicePrompt(None, torch.randn(1, 4, 2), torch.randn(1, 1, 4))
    assert copies(bare).spk_embed is None
    del voice, moved, bare
    assert len(copies) == 0  # a dropped voice frees its copy
    local = VoicePrompt(None, torch.zeros(1, 4, 2), torch.zeros(1, 1, 4))
    assert VoiceCopies("cpu")(local) is local  # already there: no copy


# ---- placement config ---------------------------------------------------------------------------------------

def test_placement_resolution_and_errors():
    assert (PlacementConfig().talker_device, PlacementConfig().vae_device) == ("cpu", "cpu")
    one = PlacementConfig(talker_device="cuda:1", vae_device="cuda:0")  # the one-device spelling, unchanged
    assert (one.talker_device, one.vae_device, one.talker_devices) == ("cuda:1", "cuda:0", ())
    assert one.talker_replicas == (("cuda:1", "cuda:0"),)
    two = PlacementConfig(talker_devices=("cuda:2", "cuda:3"))
    assert (two.talker_device, two.vae_device) == ("cuda:2", "cuda:2")  # the first replica's
    assert two.talker_replicas == (("cuda:2", "cuda:2"), ("cuda:3", "cuda:3"))
    same = PlacementConfig(talker_devices=("cuda:2", "cuda:3"), talker_device="cuda:2", vae_device="cuda:2")
    assert same == two and dataclasses.replace(two) == two  # resolved values rebuild the same placement
    for key in ("talker_device", "vae_device"):
        with pytest.raises(ValueError, match=f"engine.placement.{key} is 'cuda:0'.*left out \\(null\\) or be the "
                                             "first one, 'cuda:2'"):
            PlacementConfig(talker_devices=("cuda:2", "cuda:3"), **{key: "cuda:0"})
    with pytest.raises(ValueError, match="thinker_devices must name at least one device"):
        PlacementConfig(thinker_devices=())


def test_placement_from_config_file_and_overrides(tmp_path):
    from realtime_ming.server import load_config
    from realtime_ming.server.config import ConfigError

    cfg = load_config(None, ["engine.placement.talker_devices=[cuda:2,cuda:3]"]).engine.placement
    assert cfg.talker_devices == ("cuda:2", "cuda:3") and cfg.talker_device == "cuda:2"
    assert load_config(None, ["engine.placement.talker_devices=cpu,cpu"]).engine.placement.talker_devices == \
        ("cpu", "cpu")
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  placement:\n    talker_device: cuda:0\n    vae_device: cuda:0\n")
    with pytest.raises(ConfigError, match="engine.placement: engine.placement.talker_device is 'cuda:0'"):
        load_config(path, ["engine.placement.talker_devices=[cuda:2,cuda:3]"])
    fixed = load_config(path, ["engine.placement.talker_devices=[cuda:2,cuda:3]", "engine.placement.talker_device=null",
                               "engine.placement.vae_device=null"]).engine.placement
    assert fixed.talker_replicas == (("cuda:2", "cuda:2"), ("cuda:3", "cuda:3"))
    with pytest.raises(ConfigError, match=r"engine.placement.talker_devices\[1\]: expected a string"):
        load_config(None, ["engine.placement.talker_devices=[cpu, [1]]"])


def test_startup_checks_every_replica_device():
    from realtime_ming.server.startup import StartupError, _check_devices

    _check_devices(EngineConfig(placement=TWO))
    with pytest.raises(StartupError, match="'meta': only cpu and cuda devices"):
        _check_devices(EngineConfig(placement=PlacementConfig(talker_devices=("cpu", "meta"))))
    with pytest.raises(StartupError, match="'gpu9' is not a device"):
        _check_devices(EngineConfig(placement=PlacementConfig(talker_devices=("cpu", "gpu9"))))


# ---- the engine on the pool ---------------------------------------------------------------------------------

def _engine_pcm(bundle: ModelBundle, placement: PlacementConfig, n: int, driver: str = "inline",
                seen: dict | None = None) -> tuple[dict, dict]:
    """Every turn's PCM from an engine on `bundle` and its info(); `seen` collects each replica's enqueued turns."""
    cfg = EngineConfig(placement=placement,
                       thinker=ThinkerRunnerConfig(max_slots=4, max_seq_len=256),
                       talker=TalkerRunnerConfig(max_streams=2, driver=driver),
                       segmenter=SegmenterConfig(first_max_wait_ms=60_000.0))
    engine = Engine(cfg, bundle.with_hooks(EngineHooks(forced_reply="Hello there, friend.", steps_per_word=1)))
    if seen is not None:
        for member in engine._talker.members:
            enqueue = member.enqueue

            def tracked(op, _enqueue=enqueue, _index=member.replica.index):
                seen.setdefault(_index, set()).add(op.turn_id)
                return _enqueue(op)

            member.enqueue = tracked
    try:
        pcm, done = defaultdict(list), {}
        finished = threading.Semaphore(0)

        def sink(event):
            if isinstance(event, AudioChunk):
                pcm[event.turn_id].append(event.pcm)
            elif isinstance(event, (TurnDone, TurnFailed)):
                done[event.turn_id] = event
                finished.release()

        for i in range(n):
            engine.submit(TurnRequest(f"t{i}", f"c{i}", (Message("user", (Content.of_text("Hi."),)),),
                                      sampling=SamplingParams(max_tokens=6, ignore_eos=True, seed=i)), sink)
        deadline = time.monotonic() + 40
        for _ in range(n):
            assert finished.acquire(timeout=max(0.0, deadline - time.monotonic()))
        assert all(isinstance(e, TurnDone) for e in done.values()), done
        info = engine.info()
        if isinstance(engine._talker, TalkerPool):
            _wait_for(lambda: engine.stats().talker_streams == 0)
        return {t: np.concatenate(c) for t, c in pcm.items()}, info
    finally:
        engine.close()


def test_engine_on_two_replicas_speaks_as_on_one(pool_bundle):
    single, _ = _engine_pcm(ModelBundle.load(EngineConfig()), PlacementConfig(), 3)
    pooled, info = _engine_pcm(pool_bundle, TWO, 3)
    assert info["talker_devices"] == ["cpu", "cpu"]
    _assert_same_audio(pooled, single, [f"t{i}" for i in range(3)])


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_with_a_process_per_replica_speaks_as_inline(pool_bundle):
    """`engine.talker.driver: process` on two replicas: each replica steps in a process of its own (both used, turns
    balanced over them), every turn's audio is the inline pool's, and close stops both (their reader threads too)."""
    inline, _ = _engine_pcm(pool_bundle, TWO, 4)
    threads_before = set(threading.enumerate())
    seen: dict = {}
    processes, info = _engine_pcm(pool_bundle, TWO, 4, driver="process", seen=seen)
    assert info["talker_devices"] == ["cpu", "cpu"]
    assert sorted(seen) == [0, 1] and all(len(turns) == 2 for turns in seen.values()), seen
    _assert_same_audio(processes, inline, [f"t{i}" for i in range(4)])
    left = [t.name for t in set(threading.enumerate()) - threads_before if t.name.startswith("realtime-ming-talker")]
    assert left == []


class _Member:
    """A stand-in driver that records the calls the pool routes to it."""

    def __init__(self, index: int, fail_launch: bool = False):
        self.replica = type("Replica", (), {"index": index})()
        self.calls: list = []
        self.fail_launch = fail_launch

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, *args))
            if name == "launch" and self.fail_launch:
                raise RuntimeError("launch failed")
            return {"num_streams": 0, "pending": True, "has_work": False, "stats": None,
                    "outputs": [f"out-{self.replica.index}"]}.get(name)
        return call


def test_the_pool_routes_each_turn_to_its_member_and_drops_on_every_member():
    """The pool over any drivers: a turn's calls go to the member chosen at its first segment, `drop` (any thread,
    before the owner is known) to every member; `launch` launches every member before `outputs` collects each, and
    a member that fails to launch has the members launched before it collected and its error raised."""
    members = [_Member(0), _Member(1)]
    pool = TalkerPool(members)
    pool.drop("x")
    assert all(m.calls == [("drop", "x")] for m in members)
    pool.enqueue(Enqueue("a", 0, "One.", None))
    owner = members[pool.replica_of("a")]
    other = members[1 - pool.replica_of("a")]
    for name in ("pause", "resume", "pending"):
        getattr(pool, name)("a")
    pool.forget("a")
    assert [c[0] for c in owner.calls if c[0] != "num_streams"] == ["drop", "enqueue", "pause", "resume", "pending",
                                                                    "forget"]
    assert [c[0] for c in other.calls if c[0] != "num_streams"] == ["drop"]
    assert pool.replica_of("a") is None and not pool.pending("a")
    pool.launch()
    assert pool.outputs() == ["out-0", "out-1"]
    failing = TalkerPool([_Member(0), _Member(1, fail_launch=True), _Member(2)])
    with pytest.raises(RuntimeError, match="launch failed"):
        failing.launch()
    assert [c[0] for c in failing.members[0].calls] == ["launch", "outputs"]
    assert failing.members[2].calls == []
    assert pool.stats() is None


def test_every_driver_has_the_whole_driver_interface():
    """The engine calls its talker through `TalkerDriver` alone: the inline driver, the process driver and the pool
    of either each have every method of it, with the protocol's parameters."""
    import inspect

    from realtime_ming.engine.talker_driver import TalkerDriver

    names = [n for n, v in vars(TalkerDriver).items() if callable(v) and not n.startswith("_")]
    assert {"enqueue", "pause", "resume", "forget", "drop", "outputs", "close", "stats"} <= set(names)
    for cls in (InlineTalker, ProcessTalker, TalkerPool):
        for name in names:
            want = list(inspect.signature(getattr(TalkerDriver, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got[:len(want)] == want, (cls.__name__, name, got)
