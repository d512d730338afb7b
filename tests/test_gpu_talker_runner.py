"""The talker runner's graphed step (engine.talker_step): the step function run the way the graph runs it
(LM decode always on, batch padded to a bucket) reproduces the fixture loop on CPU; on CUDA the graphed
runner's PCM per stream equals the eager runner's for 1, 3 and 5 streams joining and ending at different
steps (fresh rows beside decoding rows, compaction, eager fallback above the largest bucket)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from realtime_ming.engine.config import EngineConfig, PlacementConfig, TalkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.talker_step import talker_step
from realtime_ming.model.cfm import CFMParams, sway
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.qwen2 import KVCache
from realtime_ming.model.kernels import TRITON
from realtime_ming.model.talker import generate, initial_history, load_talker

pytestmark = pytest.mark.timeout(300)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")

ATOL = RTOL = 1e-4  # fixtures README: loop outputs, hidden states
STOP_ATOL = 1e-5


# ---- CPU: the graph's step function ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def talker(fixture_root):
    cfg = load_checkpoint_config(fixture_root).talker
    return load_talker(cfg, fixture_root / "talker" / "model.safetensors", dtype=torch.float32, kernels=TRITON)


@torch.no_grad()
def test_step_function_in_a_padded_batch_reproduces_the_fixture_loop(talker, load_case):
    """Row 0 runs the fixture's stream, row 1 a second stream joining at step 2 (fresh beside a decoding row),
    rows 2-3 are graph padding (position -1, fresh, zeros); the LM decode runs every step, fresh rows included.
    Row 0 matches the recorded loop, row 1 its batch-1 reference loop, and the padding rows leave every cache
    row empty (their K/V go to the sink slot)."""
    tensors, meta = load_case("talker_loop")
    cfg, k, bucket = talker.cfg, meta["loop"]["K"], 4
    t_grid = sway(tensors["t_grid"])
    sde_args = CFMParams().tensor()
    cache = KVCache.allocate(cfg.llm, bucket, 256, "cpu", torch.float32)
    hid, hh, lat = talker.hidden_size, cfg.history_patch_size, talker.latent_dim
    h, his = torch.zeros(bucket, 1, hid), torch.zeros(bucket, hh, lat)
    next_embed = torch.zeros(bucket, 1, hid)
    y0, rnd = torch.zeros(bucket, cfg.patch_size, lat), torch.zeros(cfg.steps, bucket, cfg.patch_size, lat)

    prompts = [tensors["inputs_embeds"], tensors["inputs_embeds"][:, :-3]]  # row 1: a shorter prompt, no voice
    histories = [initial_history(tensors["prompt_wav_lat"], hh, lat), initial_history(None, hh, lat)]
    gen = torch.Generator().manual_seed(7)
    noise1 = [(torch.randn(1, cfg.patch_size, lat, generator=gen),
               torch.randn(cfg.steps, 1, cfg.patch_size, lat, generator=gen)) for _ in range(k)]
    noise = [lambda s: (tensors["noise_y0"][s], tensors["noise_sde"][s]), lambda s: noise1[s]]
    starts = [0, 2]
    got = [[], []]
    for step in range(k + starts[1]):
        pos = torch.full((bucket, 1), -1)
        fresh = torch.ones(bucket, dtype=torch.bool)
        y0.zero_()
        rnd.zero_()
        for r in (0, 1):
            s = step - starts[r]
            if s < 0 or s >= k:
                continue
            if s == 0:
                t = prompts[r].shape[1]
                h[r] = talker.prefill(prompts[r], torch.arange(t)[None], cache.rows(r, r + 1))[0]
                his[r] = histories[r][0]
            else:
                pos[r, 0] = prompts[r].shape[1] + s - 1
                fresh[r] = False
            y0_r, rnd_r = noise[r](s)  # [1, P, C], [S, 1, P, C]
            y0[r], rnd[:, r] = y0_r[0], rnd_r[:, 0]
        gen_lat, next_embed, stop_prob, h, his = talker_step(talker, cache, t_grid, sde_args, next_embed, pos, fresh,
                                                             h, his, y0, rnd)
        for r in (0, 1):
            if 0 <= step - starts[r] < k:
                got[r].append((h[r], gen_lat[r], next_embed[r], stop_prob[r]))

    def check(rows, want):
        for name, i in (("hidden", 0), ("gen_lat", 1), ("next_embed", 2)):
            torch.testing.assert_close(torch.stack([g[i] for g in rows]), want[name], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(torch.stack([g[3] for g in rows]), want["stop_prob"], atol=STOP_ATOL, rtol=RTOL)

    check(got[0], {"hidden": tensors["lm_last_hidden"][:, 0], "gen_lat": tensors["gen_lat"][:, 0],
                   "next_embed": tensors["next_embed"][:, 0], "stop_prob": tensors["stop_prob"][:, 0]})
    ref = list(generate(talker, prompts[1], None, t_grid=t_grid, noise=lambda s: noise1[s], max_steps=k))
    check(got[1], {name: torch.stack([getattr(s, name)[0] for s in ref])
                   for name in ("hidden", "gen_lat", "next_embed", "stop_prob")})
    for r in (0, 1):  # positions 0 .. prompt + K - 2 written, nothing else (the sink slot stays -1)
        written = sorted(p for p in cache.slot_pos[r].tolist() if p >= 0)
        assert written == list(range(prompts[r].shape[1] + k - 1))
    assert torch.all(cache.slot_pos[2:] == -1) and torch.all(cache.slot_pos[:, -1] == -1)


# ---- CUDA: graphed runner vs eager runner ----------------------------------------------------------------------

WORDS = (4, 7, 5, 6, 3)  # words per turn, 2 steps per word: turn k joining at step k ends at step 2·WORDS[k] + k - 1
STEPS_PER_WORD = 2


@pytest.fixture(scope="module")
def gpu_bundle():
    from realtime_ming.engine.models import ModelBundle

    place = PlacementConfig(thinker_devices=("cpu",), talker_device="cuda", encoder_device="cpu", vae_device="cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield ModelBundle.load(EngineConfig(dtype="float32", placement=place))
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _runner(bundle, graphs: bool, buckets=(1, 2, 4, 8, 16)):
    from realtime_ming.engine.talker_runner import TalkerRunner

    talker = TalkerRunnerConfig(max_streams=8, buckets=buckets, silence_holder=False)
    runner = TalkerRunner(bundle.with_hooks(EngineHooks(steps_per_word=STEPS_PER_WORD)),
                          EngineConfig(enforce_eager=not graphs, talker=talker))
    runner.capture()
    assert runner.stepper.graphed == graphs
    return runner


def _drive(runner, streams: int, steps: int = 1) -> tuple[dict[str, np.ndarray], list[int]]:
    """Turn k (WORDS[k] words) joins at launch k (`steps` talker steps each); launches until every stream ended.
    PCM per turn, rows per launch."""
    pcm, rows, step = defaultdict(list), [], 0
    while step < streams or runner.has_work():
        if step < streams:
            runner.enqueue(f"t{step}", 0, " ".join(["word"] * WORDS[step]), None, seed=100 + step)
        for out in runner.finish(runner.launch(steps)):
            assert out.error is None, out.error
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
        rows.append(runner.num_streams())
        step += 1
    return {t: np.concatenate(c) for t, c in pcm.items()}, rows


def _assert_pcm_close(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for turn in want:
        assert got[turn].shape == want[turn].shape, turn
        peak = float(np.abs(want[turn]).max())
        assert peak > 0, turn
        np.testing.assert_allclose(got[turn], want[turn], rtol=0, atol=1e-3 * peak, err_msg=turn)


@cuda
@pytest.mark.parametrize("streams", [1, 3, 5])
def test_graphed_runner_pcm_equals_eager_runner(gpu_bundle, streams):
    """Same schedule through the graphed and the eager runner: same per-stream PCM (fp32, 1e-3 of the peak)."""
    want, rows_eager = _drive(_runner(gpu_bundle, graphs=False), streams)
    got, rows = _drive(_runner(gpu_bundle, graphs=True), streams)
    assert rows == rows_eager and max(rows) == streams
    if streams > 1:  # a stream ended while later ones still ran: its row was refilled (compaction)
        assert any(b < a and b > 0 for a, b in zip(rows, rows[1:]))
    _assert_pcm_close(got, want)


@cuda
def test_graphed_runner_above_the_largest_bucket_and_alone(gpu_bundle):
    """Buckets (1, 2, 4) with 5 streams: 5 rows run eagerly between graphed steps, PCM unchanged; and a
    stream's audio in the 5-stream graphed batch equals the same stream alone (seeded noise per stream)."""
    want, _ = _drive(_runner(gpu_bundle, graphs=False), 5)
    got, rows = _drive(_runner(gpu_bundle, graphs=True, buckets=(1, 2, 4)), 5)
    assert max(rows) == 5
    _assert_pcm_close(got, want)
    alone, _ = _drive(_runner(gpu_bundle, graphs=True), 1)
    _assert_pcm_close(alone, {"t0": got["t0"]})


@cuda
def test_graphed_runner_several_steps_per_launch_equals_one(gpu_bundle):
    """`launch(3)`: three graphed steps queued back to back (each replay's outputs copied before the next reuses
    the graph memory), streams ending at any of them: the same PCM as one step per launch."""
    want, _ = _drive(_runner(gpu_bundle, graphs=True), 5)
    got, rows = _drive(_runner(gpu_bundle, graphs=True), 5, steps=3)
    assert max(rows) >= 2
    _assert_pcm_close(got, want)


@cuda
def test_graphed_pipelined_inline_talker_equals_one_launch_at_a_time(gpu_bundle):
    """`engine.talker.pipeline` inline: each launch replays the graphs before the last one is finished (its outputs
    copied out of graph memory, its VAE chunk on the VAE's stream beside the next step), streams ending and rows
    compacting between launch and finish, one turn paused with a launch in flight and resumed later: the same PCM
    as one launch finished at a time."""
    from realtime_ming.engine.talker_driver import Enqueue
    from realtime_ming.engine.talker_inline import InlineTalker

    want, _ = _drive(_runner(gpu_bundle, graphs=True), 5)
    talker = InlineTalker(_runner(gpu_bundle, graphs=True), pipeline=True)
    pcm, launches = defaultdict(list), 0
    while launches < 5 or talker.has_work():
        if launches < 5:
            talker.enqueue(Enqueue(f"t{launches}", 0, " ".join(["word"] * WORDS[launches]), None, seed=100 + launches))
        talker.launch()
        if launches == 3:
            talker.pause("t1")  # t1 holds a row and a step in flight: finished first, then parked
        if launches == 6:
            talker.resume("t1")
        for out in talker.outputs():
            assert out.error is None, out.error
            if out.pcm is not None:
                pcm[out.turn_id].append(out.pcm)
        launches += 1
    _assert_pcm_close({t: np.concatenate(c) for t, c in pcm.items()}, want)
