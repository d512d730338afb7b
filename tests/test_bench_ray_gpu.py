"""bench/ray_gpu.sh and bench/ray_kill.py (issue 45's GPU replicas behind Ray Serve), checked on CPU: a real-time
player's stall as `ray_kill` measures it, the verdict's checks (a kill that found every session on one replica
proves nothing and fails), and — marked `ray` — the script's scale and kill stages end to end with two tiny CPU
replicas, each with two front-end processes: the killed replica's sessions end replica_lost / 1012, the others
finish, new sessions go elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.ray_kill import RATE_HZ, Session, _markdown

ROOT = Path(__file__).resolve().parent.parent


def test_a_real_time_players_longest_stall():
    s = Session(0)
    second = RATE_HZ * 2  # bytes of one second of pcm16
    s.hear(second, 10.0)  # plays 10.0 - 11.0
    s.hear(second, 10.5)  # early: no stall
    assert s.underrun_s == 0.0 and s.audio_s == 2.0
    s.hear(second, 12.3)  # due at 12.0: the player waited 0.3 s
    assert abs(s.underrun_s - 0.3) < 1e-9
    s.hear(second, 12.4)  # due at 13.0 by the schedule, which a late chunk does not move
    assert abs(s.underrun_s - 0.3) < 1e-9 and s.first_audio == 10.0


def _one_target_run(path: Path, target: str, ms_by_c: dict[int, list[float]]) -> str:
    levels = [{"target": target, "concurrency": c, "round": 0,
               "samples": [{"is_warmup": True, "ok": True, "ttfa_server_s": 9.0}]
               + [{"is_warmup": False, "ok": True, "ttfa_server_s": v / 1000} for v in values]
               + [{"is_warmup": False, "ok": False, "ttfa_server_s": 9.0}]}
              for c, values in ms_by_c.items()]
    path.write_text(json.dumps({"targets": {target: {}}, "levels": levels}))
    return str(path)


def test_rounds_pair_one_target_runs_taking_turns(tmp_path, capsys):
    """The one-GPU overhead stage's runs (one target per file): a target's k-th file is round k, warm-up and failed
    turns left out, the difference first - second per round and its median; a level one target lacks is named."""
    from bench.ray_rounds import main
    files = [_one_target_run(tmp_path / "r1.json", "ray", {16: [9, 10, 11], 64: [30]}),
             _one_target_run(tmp_path / "r2.json", "ray", {16: [20, 23, 30]}),
             _one_target_run(tmp_path / "p1.json", "plain", {16: [10], 64: [28]}),
             _one_target_run(tmp_path / "p2.json", "plain", {16: [38, 40, 41]})]
    main(files)
    out = capsys.readouterr().out.splitlines()
    assert "c=16 round 1: ray 10  plain 10  difference +0 ms" in out
    assert "c=16 round 2: ray 23  plain 40  difference -17 ms" in out
    assert "c=16: median of the per-round differences -8 ms" in out  # -8.5, to even
    assert "c=64 round 1: ray 30  plain 28  difference +2 ms" in out
    assert "c=64: median of the per-round differences +2 ms" in out
    with pytest.raises(SystemExit):
        main(files[:2])


def test_the_verdict_names_each_check_and_a_failed_one_stands_out():
    result = {"url": "ws://x/v1/realtime", "sessions_per_replica": {"a": 3}, "victim": "a", "lost": 3, "kept": 0,
              "lost_close_s": {"min": 1.0, "max": 2.0}, "kept_worst_underrun_ms": 0.0, "fresh_replicas": ["b"],
              "checks": {"sessions on two replicas or more (some lost, some kept)": False,
                         "lost sessions end with replica_lost, close 1012": True}}
    text = _markdown(result)
    assert "| sessions on two replicas or more (some lost, some kept) | **no** |" in text
    assert "| lost sessions end with replica_lost, close 1012 | yes |" in text
    assert "closed 1.00–2.00 s after the kill" in text


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_gpu_replica_script_runs_its_scale_and_kill_stages_on_cpu(tmp_path):
    pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'realtime-ming[cluster]')")
    env = dict(os.environ, CONFIG="configs/tiny-cpu.yaml", MODEL_SET="", GPUS="0", SETUP="0", REPLICAS="2", FRONTENDS="2",
               CPUS_PER_REPLICA="1", STAGES="scale kill", SCALE_C="2", TURNS="1", KILL_SESSIONS="4",
               KILL_STALL_MS="2000", READY_S="420")  # a busy 2-core box: the stall bound is the GPU run's business
    proc = subprocess.run(["bash", str(ROOT / "bench" / "ray_gpu.sh"), str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kill rc=0" in proc.stdout, proc.stdout[-3000:]
    kill = json.loads((tmp_path / "scale" / "kill" / "ray_kill.json").read_text())
    assert all(kill["checks"].values()), kill["checks"]
    assert kill["lost"] >= 1 and kill["kept"] >= 1
    lost = [s for s in kill["sessions"] if s["replica"] == kill["victim"] and s["index"] < 4]
    assert all(s["error_code"] == "replica_lost" and s["close_code"] == 1012 for s in lost)
    assert (tmp_path / "scale" / "bench" / "results.json").exists()
    health = json.loads((tmp_path / "scale" / "health.json").read_text())
    assert [r["processes"] for r in health["replicas"]] == [2, 2]  # the sessions ran in front-end processes
    summary = (tmp_path / "summary.md").read_text()
    assert "## kill" in summary and "sessions per replica at the busiest sample: {" in summary
