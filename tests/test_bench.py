"""bench/ end to end against our server on loopback.

A short concurrency sweep on the real engine (embedded tiny model, CPU, thinker `forced_reply`;
c = 1, 2; one warmup and one measured espeak-ng turn per session) must write the JSON, the Markdown summary and the plots
with every turn successful, and the client's TTFA_server must agree with the server's own timing
event. Barge-in and a two-target comparison run on the scripted StubEngine, whose answers always
speak and last long enough to interrupt. Turns are limited to the short utterances to stay fast.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import tiny_engine_fixture
from server_support import seconds, stub_served

from realtime_ming.bench.config import BenchConfig, Target, TurnMode
from realtime_ming.bench.report import write_results
from realtime_ming.bench.runner import run_benchmark
from realtime_ming.bench.turns import load_turns

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (apt-get install -y espeak-ng)"),
]

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# The tiny model's weights are random: its own text is often unspeakable bytes (a silent answer).
# forced_reply makes the thinker emit these words while every model computation still runs.
_FORCED_REPLY = "Sure. The weather today looks sunny, with a light breeze from the west. "


# The real engine on the embedded tiny default, thinker forced to speak words (loaded once); `server` is conftest's.
engine = tiny_engine_fixture(forced_reply=_FORCED_REPLY)


@pytest.fixture(scope="module")
def turns_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench-turns")


def _config(url: str, out: Path, cache: Path, **overrides) -> BenchConfig:
    values = {
        "targets": (Target("A", url),),
        "concurrency": (1,),
        "num_turns": 1,
        "num_warmup_turns": 0,
        "max_output_tokens": 6,
        "max_turn_s": 1.5,
        "pause_s": 0.2,
        "stagger_s": 0.2,
        "turn_timeout_s": seconds(60),
        "turns_cache_dir": str(cache),
        "out_dir": str(out),
        "show_progress": False,
    }
    values.update(overrides)
    return BenchConfig(**values)


async def _run(cfg: BenchConfig, *, plots: bool = True):
    turns = load_turns(use_default=True, wav_dir=None, cache_dir=cfg.turns_cache_dir, wire_rate_hz=cfg.sample_rate_hz,
                       silence_dbfs=cfg.silence_dbfs, max_turn_s=cfg.max_turn_s)
    results = await run_benchmark(cfg, turns, "pytest")
    return results, write_results(results, Path(cfg.out_dir), plots=plots)


def _failures(results) -> list[str]:
    return [f"{lv['target']} c={lv['concurrency']} s{s['session']} {s['turn']}: {s['failure']}"
            for lv in results["levels"] for s in lv["samples"] if not s["ok"]]


@pytest.mark.slow  # the full tier: the sweep's levels end to end
async def test_bench_sweep_writes_results_and_every_turn_succeeds(server, engine, tmp_path, turns_cache):
    """c=1,2 sweep: results.json, summary.md and 3 PNGs written; all 6 turns ok; client TTFA_server ≈ server's."""
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    cfg = _config(url, tmp_path / "run", turns_cache, concurrency=(1, 2), num_warmup_turns=1, max_turn_s=1.0)
    _, paths = await _run(cfg)

    assert {p.name for p in paths.values()} == {"results.json", "summary.md", "ttfa_cdf.png",
                                                "ttfa_vs_concurrency.png", "stages.png"}
    for name in ("ttfa_cdf", "ttfa_vs_concurrency", "stages"):
        assert paths[name].read_bytes()[:8] == _PNG_MAGIC
    saved = json.loads(paths["json"].read_text())
    assert saved["schema"] == "realtime-ming-bench/1" and saved["config"]["concurrency"] == [1, 2]
    assert [(lv["concurrency"], len(lv["samples"])) for lv in saved["levels"]] == [(1, 2), (2, 4)]
    assert _failures(saved) == []
    assert sum(s["is_warmup"] for lv in saved["levels"] for s in lv["samples"]) == 3

    info = saved["targets"]["A"]
    assert info["models"]["data"][0]["id"] == engine.info()["model"]
    assert info["health"]["status"] == "ok"
    assert info["timings_enabled"] is True and info["session"]["max_output_tokens"] == 6
    for s in (s for lv in saved["levels"] for s in lv["samples"]):
        assert s["ttfa_server_from"] == "speech_stopped"
        # Both clocks time speech_stopped → first audio delta; loopback transport cancels out.
        assert abs(s["ttfa_server_s"] - s["ttfa_server_reported_s"]) < seconds(0.1)
        assert s["num_chunks"] == len(s["chunks"]["at_ms"]) > 0
        assert s["stages_ms"]["first_audio_delta"] == pytest.approx(s["ttfa_server_reported_s"] * 1000.0)

    summary = saved["summary"]["A"]
    assert [(summary[c]["num_turns"], summary[c]["num_ok"]) for c in ("1", "2")] == [(1, 1), (2, 2)]
    markdown = paths["markdown"].read_text()
    assert "| A | 1 | 1/1" in markdown and "| A | 2 | 2/2" in markdown
    assert "## Server stages" in markdown and "![ttfa_cdf](ttfa_cdf.png)" in markdown


@pytest.fixture
async def stub_server():
    """Our server on the scripted StubEngine: 40 words, each 0.1 s of tone every 30 ms (never silent)."""
    async with stub_served(words=("word ",) * 40, chunk_s=0.1, step_s=0.03) as srv:
        yield srv


async def test_bench_barge_in_measures_the_stop(stub_server, tmp_path, turns_cache):
    """Barge-in: the interrupted response ends cancelled, no delta follows its done, stop latency is measured."""
    cfg = _config(f"ws://127.0.0.1:{stub_server.port}/v1/realtime", tmp_path / "barge", turns_cache, barge_in=True,
                  barge_in_after_ms=100.0)
    results, paths = await _run(cfg, plots=False)
    assert _failures(results) == []
    (sample,) = results["levels"][0]["samples"]
    barge = sample["barge"]
    assert (sample["response_status"], sample["response_reason"]) == ("cancelled", "turn_detected")
    assert (barge["cancelled"], barge["missed"], barge["num_deltas_after_done"]) == (True, False, 0)
    assert 0.0 <= barge["stop_last_delta_s"] <= barge["stop_done_s"]
    assert barge["followup_status"] == "completed"
    assert results["summary"]["A"]["1"]["barge"]["num_measured"] == 1
    assert "## Barge-in" in paths["markdown"].read_text()


@pytest.mark.slow  # ~20 s: two targets, two rounds
async def test_bench_comparison_interleaves_two_targets(stub_server, tmp_path, turns_cache):
    """Manual mode, two targets, two rounds: level runs go A, B, B, A and the ratios are B's over A's."""
    url = f"ws://127.0.0.1:{stub_server.port}/v1/realtime"
    cfg = _config(url, tmp_path / "cmp", turns_cache, mode=TurnMode.MANUAL, max_turn_s=1.0, num_rounds=2,
                  targets=(Target("A", url), Target("B", url, session={"instructions": "Be brief."})))
    results, paths = await _run(cfg, plots=False)
    assert _failures(results) == []
    assert [lv["target"] for lv in results["levels"]] == ["A", "B", "B", "A"]
    assert {s["ttfa_server_from"] for lv in results["levels"] for s in lv["samples"]} == {"committed"}
    assert results["targets"]["B"]["session"]["instructions"] == "Be brief."
    summary = results["summary"]
    assert summary["A"]["1"]["num_turns"] == summary["B"]["1"]["num_turns"] == 2
    ratio = results["comparison"]["ratios"]["1"]["ttfa_user_s.p50"]
    assert ratio == pytest.approx(summary["B"]["1"]["ttfa_user_s"]["p50"] / summary["A"]["1"]["ttfa_user_s"]["p50"])
    assert "## Comparison: B / A" in paths["markdown"].read_text()


async def test_bench_checkpoints_each_finished_level(stub_server, tmp_path, turns_cache):
    """`on_level` gets the results after every level, summarised over finished levels only, and they write."""
    url = f"ws://127.0.0.1:{stub_server.port}/v1/realtime"
    cfg = _config(url, tmp_path / "ckpt", turns_cache, mode=TurnMode.MANUAL, max_turn_s=1.0, concurrency=(1, 2))
    turns = load_turns(use_default=True, wav_dir=None, cache_dir=cfg.turns_cache_dir, wire_rate_hz=cfg.sample_rate_hz,
                       silence_dbfs=cfg.silence_dbfs, max_turn_s=cfg.max_turn_s)
    seen = []

    def on_level(partial):
        seen.append(partial)
        write_results(partial, tmp_path / "ckpt", plots=False)

    final = await run_benchmark(cfg, turns, "pytest", on_level=on_level)
    assert [sorted(p["summary"]["A"]) for p in seen] == [["1"], ["1", "2"]]
    assert all(p["partial"] is True for p in seen) and "partial" not in final
    assert [lv["concurrency"] for lv in seen[0]["levels"]] == [1]
    assert seen[-1]["summary"] == final["summary"]
    assert "| A | 2 | 2/2" in (tmp_path / "ckpt" / "summary.md").read_text()


def test_engine_bench_runs_and_writes_its_tables(tmp_path):
    """bench.engine_bench on the tiny CPU engine: one level, spoken and text, JSON + Markdown with throughput."""
    import json

    from bench import engine_bench

    assert engine_bench.main(["--levels", "1", "--rounds", "1", "--max-tokens", "4", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "engine_bench.json").read_text())
    assert {s["mode"] for s in saved["samples"]} == {"spoken", "text"}
    assert all(s["turns_per_s"] > 0 for s in saved["samples"])
    # every turn's prompt is prefilled in some launch and its tokens decoded in later ones (one turn in flight)
    assert all(0 < s["chunk_share"] < 1 for s in saved["samples"])
    text = (tmp_path / "engine_bench.md").read_text()
    assert "turns/s" in text and "thinker steps with a prefill chunk" in text


@pytest.mark.slow
def test_engine_bench_reports_the_talker_processes_loops(tmp_path):
    """With the talker in a process of its own, engine_bench reads the child's loop totals: a table of launches, time
    in launch / finish, idle share, rows per step and job starts, every figure from the level's own work."""
    import json

    from bench import engine_bench

    assert engine_bench.main(["--levels", "2", "--rounds", "1", "--waves", "2", "--modes", "spoken", "--max-tokens",
                              "6", "--set", "engine.talker.driver=process",
                              "--out", str(tmp_path)]) == 0
    loops = json.loads((tmp_path / "engine_bench.json").read_text())["samples"][0]["talker_loops"]
    assert loops["launches_per_s"] > 0 and loops["launch_ms"] > 0 and loops["finish_ms"] > 0
    assert 0 <= loops["idle"] < 1 and loops["rows_per_step"] >= 1 and loops["jobs_per_s"] > 0
    assert "## spoken turns: talker loops" in (tmp_path / "engine_bench.md").read_text()


def test_engine_bench_spread_lengths_and_staggered_starts(tmp_path):
    """--length-spread: each turn's tokens seeded by its index, within the spread, the mean kept; a closed loop with
    spread lengths and staggered starts runs every turn to its own length."""
    import json
    import statistics

    from bench import engine_bench

    tokens = [engine_bench.turn_tokens(i, 12, 0.5) for i in range(400)]
    assert tokens == [engine_bench.turn_tokens(i, 12, 0.5) for i in range(400)]
    assert min(tokens) >= 6 and max(tokens) <= 18 and len(set(tokens)) > 8
    assert abs(statistics.mean(tokens) - 12) < 0.6
    assert {engine_bench.turn_tokens(i, 12, 0.0) for i in range(50)} == {12}
    assert engine_bench.main(["--levels", "2", "--rounds", "1", "--waves", "2", "--modes", "text", "--max-tokens", "6",
                              "--length-spread", "0.5", "--stagger-ms", "20", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "engine_bench.json").read_text())
    (sample,) = saved["samples"]
    assert sample["tokens"] == sum(engine_bench.turn_tokens(i, 6, 0.5) for i in range(4))
    assert saved["meta"]["length_spread"] == 0.5 and saved["meta"]["stagger_ms"] == 20
    assert "6 x [0.50, 1.50]" in (tmp_path / "engine_bench.md").read_text()


def test_engine_bench_trace_summary_busy_per_gpu():
    """The profile's GPU occupancy (engine_bench --profile, bench/torch_trace.py): the union of kernel intervals over
    the span, per device/stream, and per GPU apart when the trace has several (overlapping kernels of two streams
    count once)."""
    from bench.torch_trace import trace_summary

    def kernel(pid, tid, ts, dur):
        return {"ph": "X", "cat": "kernel", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": "k"}

    trace = {"traceEvents": [kernel(0, 7, 0, 100), kernel(0, 9, 50, 100),  # GPU 0: 0-150 of 0-200
                             kernel(1, 7, 150, 50),  # GPU 1: 150-200
                             {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5}]}
    text = "\n".join(trace_summary(trace))
    assert "some kernel running 100% of the time" in text
    assert "| 0/7 | 0 | 50% |" in text and "| 1/7 | 0 | 25% |" in text
    assert "| 0 | 75% | 2 |" in text and "| 1 | 25% | 1 |" in text
    assert "| cudaGraphLaunch | 1 |" in text


def test_talker_admission_bench_runs_and_writes_its_table(tmp_path):
    """bench.talker_admission on the tiny CPU engine: the segment→first-talker-step gap in steps and ms, `_start` ms."""
    import json

    from bench import talker_admission

    assert talker_admission.main(["--levels", "1", "--rounds", "1", "--waves", "1", "--max-tokens", "12",
                                  "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "talker_admission.json").read_text())
    level = saved["summary"]["1"]
    gap = level["gaps"]["first_segment->first_talker_step"]
    assert level["turns"] == 1 and gap["steps_max"] == 0 and gap["ms_p50"] > 0
    assert level["starts"] >= 1 and level["start_ms_p50"] > 0
    assert "segment→talker step" in (tmp_path / "talker_admission.md").read_text()


@pytest.mark.slow
def test_talker_pool_bench_runs_every_member_and_writes_its_report(tmp_path):
    """bench.talker_pool_bench on the tiny talker (two CPU replicas): the inline pool and a process per replica,
    beside a GIL-holding thread; every cell speaks for a full window; JSON, Markdown and the plot."""
    import json

    from bench import talker_pool_bench

    assert talker_pool_bench.main(["--preset", "tiny", "--devices", "cpu,cpu", "--streams", "2", "--words", "4",
                                   "--warm-s", "0.5", "--seconds", "1.5", "--gil-duty", "0.7",
                                   "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "talker_pool_bench.json").read_text())
    cells = {(r["member"], r["gil_duty"]) for r in saved["results"]}
    assert cells == {(m, 0.7) for m in ("inline", "process")}
    assert all(r["audio_s_per_s"] > 0 and r["seconds"] >= 1.5 for r in saved["results"])  # every cell spoke
    assert "| process | 0.7 |" in (tmp_path / "talker_pool_bench.md").read_text()
    assert (tmp_path / "talker_pool_bench.png").stat().st_size > 0
    loops = {r["member"]: r["loops"] for r in saved["results"]}
    assert loops["inline"] == {}  # the caller steps it: no loop of its own
    assert loops["process"]["launches_per_s"] > 0 and loops["process"]["launch_ms"] > 0
    assert "| process | 0.7 | " in (tmp_path / "talker_pool_bench.md").read_text().split("Talker loops")[1]


@pytest.mark.slow
def test_talker_pool_bench_speaks_turns_of_several_jobs(tmp_path):
    """--segments: each turn is that many talker jobs (one after another), and the loops start them all."""
    import json

    from bench import talker_pool_bench

    assert talker_pool_bench.main(["--preset", "tiny", "--devices", "cpu", "--streams", "2", "--segments", "1,2,2",
                                   "--members", "process", "--warm-s", "0.5", "--seconds", "1.5", "--gil-duty", "0",
                                   "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "talker_pool_bench.json").read_text())["results"][0]
    assert row["segments"] == [1, 2, 2] and row["turns_per_s"] > 0
    assert row["jobs_per_turn"] == [3]  # every turn finished in the window had all three of its jobs started
    assert row["loops"]["jobs_per_s"] > row["turns_per_s"]  # the loops' own count (a window's rate, edges blur it)
