"""bench/mixed_step_bench.py runs end to end on CPU (the fixture's thinker, eager): both ways timed for every
(history, chunk) pair, JSON / markdown / plot written, and --replot redraws from the JSON."""

from __future__ import annotations

import json

import pytest

from bench import mixed_step_bench

pytestmark = pytest.mark.slow  # a bench script end to end: the full tier


def test_mixed_step_bench_smoke_on_cpu(fixture_root, tmp_path):
    out = tmp_path / "msb"
    mixed_step_bench.main(["--out", str(out), "--preset", str(fixture_root), "--device", "cpu", "--tp", "1",
                           "--rows", "3", "--chunks", "8,16", "--histories", "0,32", "--capacity", "128",
                           "--iters", "2"])
    report = json.loads((out / "mixed_step_bench.json").read_text())
    assert [(r["history"], r["chunk"]) for r in report["results"]] == [(0, 8), (0, 16), (32, 8), (32, 16)]
    assert all(r["two_forwards_ms"] > 0 and r["mixed_ms"] > 0 and r["rows"] == 3 for r in report["results"])
    assert report["dtype"] == "float32" and report["tp_shadow"] == 1
    assert (out / "mixed_step_bench.md").read_text().count("\n| ") == 5  # header + 4 rows
    (out / "mixed_step_bench.png").unlink()
    mixed_step_bench.main(["--replot", str(out / "mixed_step_bench.json")])
    assert (out / "mixed_step_bench.png").stat().st_size > 0
