"""The GPU benchmark kit on CPU: gpu_bench's talker serving-rate stage (dry, tiny preset) and env_check.

Talker req/s follows issue 8's definition: a ~6 s reply is 19 talker steps of 0.32 s; at batch c
all c streams step together, one batch step costing the graphed talker step plus one VAE chunk.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.env_check import import_problems, requirement_problems, turn_problems
from bench.gpu_bench import talker_throughput

REPO = Path(__file__).resolve().parent.parent


def test_talker_throughput_matches_the_hand_computed_rate():
    talker = {1: {"step_ms": 10.0}, 8: {"step_ms": 25.0}, 16: {"step_ms": 40.0}}
    vae = {1: {"graph_ms": 2.0}, 2: {"graph_ms": 3.0}, 16: {"graph_ms": 4.0}}
    out = talker_throughput(talker, vae)
    assert sorted(out) == [1, 16]  # c=2 lacks a talker time, c=8 a VAE time
    # c=1: 19 × 12 ms = 0.228 s per reply → 4.386 req/s; RTF 12 / 320
    assert out[1]["reply_s"] == pytest.approx(0.228)
    assert out[1]["req_per_s"] == pytest.approx(1 / 0.228)
    assert out[1]["rtf_per_stream"] == pytest.approx(0.0375)
    # c=16: 19 × 44 ms = 0.836 s for 16 replies → 19.14 req/s
    assert out[16]["req_per_s"] == pytest.approx(16 / 0.836)
    assert out[16]["batch_step_ms"] == pytest.approx(44.0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gpu_bench_dry_run_reports_talker_req_per_s(tmp_path):
    cmd = [sys.executable, str(REPO / "bench" / "gpu_bench.py"), "--dry-cpu", "--out", str(tmp_path),
           "--stages", "talker,vae,talker_throughput", "--talker-buckets", "1,2", "--reps", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert "notes" not in data, data.get("notes")  # no stage failed or was skipped
    stages = data["stages"]
    levels = stages["talker_throughput_derived"]["levels"]
    assert sorted(levels) == ["1", "2"]  # only the buckets that were measured
    for c, row in levels.items():
        step_ms = stages["talker"][c]["step_ms"] + stages["vae_decode_chunk"][c]["graph_ms"]
        assert row["req_per_s"] == pytest.approx(int(c) / (19 * step_ms / 1e3))
        assert row["rtf_per_stream"] == pytest.approx(step_ms / 320)
    assert "| c | talker step ms | VAE chunk ms |" in (tmp_path / "gpu_bench.md").read_text()


def test_env_check_flags_missing_and_out_of_range_requirements(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = [\n  "numpy<1",\n  "pytest>=1",\n'
                         '  "no-such-package-xyz>=1",\n  "websockets>=1; sys_platform == \'nonexistent\'",\n]\n')
    problems = dict(requirement_problems(pyproject))
    assert "out of range" in problems["numpy<1"]
    assert problems["no-such-package-xyz>=1"] == "not installed"
    assert [p for name, p in problems.items() if name.startswith("pytest==")] == [""]
    assert len(problems) == 3  # the requirement whose marker is false is not checked


def test_env_check_reports_import_failures_and_missing_turns(tmp_path):
    results = dict(import_problems(["json", "no_such_module_xyz"]))
    assert results["json"] == ""
    assert results["no_such_module_xyz"].startswith("ModuleNotFoundError")
    (tmp_path / "short-us-0123456789ab.wav").write_bytes(b"")
    missing = [name for name, problem in turn_problems(tmp_path) if problem]
    assert "short-us" not in missing and "long-gb-f" in missing and len(missing) == 5
